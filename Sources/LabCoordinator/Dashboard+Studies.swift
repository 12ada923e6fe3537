import Foundation
import HeraldAnalysis
import HeraldCore
import LabHTTP
import LabPlan

/// What the dashboard keeps of the studies among the coordinator's runs: each run's `studyRun`
/// (read once from its plan text) and each study's comparison, kept while the set of its
/// finished runs is the same (a bootstrap per page load would cost seconds).
final class StudyCache: @unchecked Sendable {
    private let lock = NSLock()
    private var memberships: [String: StudyMembership?] = [:]
    private var outcomes: [String: (runs: [String], outcome: Result<Comparison.Outcome, StudyCompareError>)] = [:]

    func membership(_ r: RunRecord) -> StudyMembership? {
        if let known = lock.withLock({ memberships[r.id] }) { return known }
        // The text was checked when the run was submitted; one that no longer parses (an older
        // coordinator's) is in no study.
        let m: StudyMembership?
        do { m = try Plan.parse(yaml: r.planText, source: "run \(r.id)").studyRun } catch { m = nil }
        lock.withLock { memberships[r.id] = m }
        return m
    }

    /// The study's comparison for exactly these runs: the cached one, or `compute`'s (cached).
    func outcome(_ key: String, runs: [String], compute: () -> Result<Comparison.Outcome, StudyCompareError>) -> Result<Comparison.Outcome, StudyCompareError> {
        if let c = lock.withLock({ outcomes[key] }), c.runs == runs { return c.outcome }
        let o = compute()
        lock.withLock { outcomes[key] = (runs, o) }
        return o
    }

    func cached(_ key: String, runs: [String]) -> Comparison.Outcome? {
        lock.withLock {
            guard let c = outcomes[key], c.runs == runs, case .success(let o) = c.outcome else { return nil }
            return o
        }
    }
}

struct StudyCompareError: Error { var message: String }

/// A study as the dashboard finds it among the coordinator's runs (docs/API.md, "Dashboard").
struct DashboardStudy {
    var study: Study
    var plan: String
    /// Its runs, in run order, with their place in the study.
    var runs: [(record: RunRecord, membership: StudyMembership)]
    /// Runs whose bundle can be compared (complete, or aborted with what was gathered).
    var finished: [(record: RunRecord, membership: StudyMembership)] {
        runs.filter { [.complete, .aborted].contains($0.record.state) && $0.record.bundle != nil }
    }
    /// The cache key: the study's definition (two studies may share a name).
    var key: String
    /// What keeps the comparison from being made: levels with no finished run.
    var missing: [String] {
        let done = Set(finished.map(\.membership.level))
        return study.levelNames.filter { !done.contains($0) }
    }
    var planned: Int { study.levelNames.count * study.repeats }

    /// How long `herald-lab run STUDY` may take between one run's end and the next run's
    /// submission (fetching the bundle, analysing it) before the study is taken to have stopped.
    static let submissionGap: Double = 300

    /// Whether the study is still going on at `now`: a run of it has not ended, or runs are
    /// still to come and the last one ended lately (the CLI submits them one by one, and the
    /// coordinator knows nothing of studies beyond each run's `studyRun`).
    func inProgress(now: Double) -> Bool {
        if runs.contains(where: { !$0.record.state.isFinal }) { return true }
        guard runs.count < planned else { return false }
        let last = runs.map { $0.record.ended ?? $0.record.created }.max() ?? 0
        return now - last < Self.submissionGap
    }

    /// Runs that ended without their bundle (failed, cancelled): something actually failed.
    var failed: [(record: RunRecord, membership: StudyMembership)] {
        runs.filter { [.failed, .cancelled].contains($0.record.state) }
    }

    /// Seconds left, roughly: the running run's remainder, and each run still to come at the
    /// duration of the latest run plus the arming and gathering the finished runs took (each
    /// bounded by 10 minutes).
    func secondsLeft(now: Double) -> Double {
        let ended = runs.filter { $0.record.state.isFinal }
        let overheads = ended.compactMap { r -> Double? in
            guard let start = r.record.startAt, let end = r.record.ended else { return nil }
            return min(max(start - r.record.created, 0), 600) + min(max(end - start - r.record.duration, 0), 600)
        }
        let overhead = overheads.isEmpty ? 0 : overheads.reduce(0, +) / Double(overheads.count)
        let duration = runs.last?.record.duration ?? 0
        var left = Double(max(0, planned - runs.count)) * (duration + overhead)
        for (r, _) in runs where !r.state.isFinal {
            if r.state == .running, let start = r.startAt { left += max(0, start + r.duration - now) + min(overhead, 600) }
            else if r.state == .gathering { left += min(overhead, 600) }
            else { left += r.duration + overhead }
        }
        return left
    }

    /// "about 100 s left", "about 25 min left".
    static func about(_ seconds: Double) -> String {
        guard seconds.isFinite, seconds >= 0 else { return "time left unknown" }
        let s = Int(seconds.rounded())
        return s < 600 ? "about \(s) s left" : "about \(Int((seconds / 60).rounded())) min left"
    }

    /// The runs not yet submitted, as the study's blocks tell them: index, block and the level
    /// when the block's submitted runs leave one, else the levels it may be.
    var plannedOnly: [(index: Int, block: Int, levels: [String])] {
        let names = study.levelNames
        guard !names.isEmpty else { return [] }
        let taken = Set(runs.map(\.membership.index))
        var out = [(index: Int, block: Int, levels: [String])]()
        for i in 0..<planned where !taken.contains(i) {
            let block = i / names.count
            let used = Set(runs.filter { $0.membership.block == block }.map(\.membership.level))
            out.append((i, block, names.filter { !used.contains($0) }))
        }
        return out
    }
}

extension Coordinator {
    /// The studies among the coordinator's runs, newest first.
    func dashboardStudies() -> [DashboardStudy] {
        let all = withLock { Array(runs.values) }
        var groups = [String: DashboardStudy]()
        for r in all {
            guard let m = dashboard.studies.membership(r) else { continue }
            let definition = [m.study.name, "\(m.study.repeats)"] + m.study.factors.map { "\($0.path)=\($0.levels.joined(separator: "\u{1E}"))" }
                + m.study.margins.sorted { $0.key < $1.key }.map { "\($0.key):\($0.value)" }
            let key = ([r.plan] + definition).joined(separator: "\u{1F}")
            groups[key, default: DashboardStudy(study: m.study, plan: r.plan, runs: [], key: key)].runs.append((r, m))
        }
        var out = Array(groups.values)
        for i in out.indices { out[i].runs.sort { ($0.membership.index, $0.record.created) < ($1.membership.index, $1.record.created) } }
        return out.sorted { ($0.runs.map(\.record.created).max() ?? 0) > ($1.runs.map(\.record.created).max() ?? 0) }
    }

    /// A study's comparison, computed with the analysis's own code (`Comparison.design(study:)`,
    /// as `herald-lab compare` does for a study folder) from the bundles the coordinator holds,
    /// once per set of finished runs.
    func studyOutcome(_ s: DashboardStudy) -> Result<Comparison.Outcome, StudyCompareError> {
        let done = s.finished
        let ids = done.map(\.record.id).sorted()
        return dashboard.studies.outcome(s.key, runs: ids) {
            let index = StudyIndex(
                study: s.study.name, plan: s.plan, factors: s.study.factors.map { .init(path: $0.path, levels: $0.levels) },
                levels: s.study.levelNames, repeats: s.study.repeats, margins: s.study.margins, crossover: s.study.labDesign.isCrossover,
                runs: done.map { r, m in
                    StudyIndex.Run(index: m.index, block: m.block, level: m.level, seed: 0, bundle: r.id, state: r.state.rawValue,
                                   nodes: r.nodes.map { .init(node: $0.name, agent: $0.agent, dongle: $0.dongle.map { .init(id: $0.id, name: $0.name) }) })
                })
            do {
                let design = try Comparison.design(study: config.results, index: index)
                guard design.levels.filter({ !$0.runs.isEmpty }).count >= 2 else { return .failure(StudyCompareError(message: "fewer than two levels have a bundle")) }
                return .success(Comparison.compare(design))
            } catch {
                return .failure(StudyCompareError(message: "\(error)"))
            }
        }
    }

    static func studyPath(_ name: String) -> String { "/studies/\(segment(name))" }

    /// The Trends page's list of studies: runs and levels of each, a link to its effects.
    func studiesSection() -> String {
        let studies = dashboardStudies()
        guard !studies.isEmpty else { return "<h2>Studies</h2><p id=\"nostudies\" class=\"small\">No study among the runs: <code>herald-lab run STUDY</code> submits each run of a study with its <code>studyRun</code>.</p>" }
        var body = "<h2>Studies</h2><table id=\"studies\"><tr><th>study</th><th>plan</th><th>factor</th><th>levels (finished of planned runs)</th><th>runs</th><th>effects</th></tr>"
        for s in studies.prefix(50) {
            let done = s.finished
            let levels = s.study.levelNames.map { l in "\(Self.h(l)) (\(done.filter { $0.membership.level == l }.count)/\(s.study.repeats))" }.joined(separator: ", ")
            let cached = dashboard.studies.cached(s.key, runs: done.map(\.record.id).sorted())
            let effects: String
            if s.inProgress(now: now) {
                effects = "<span class=\"running\">in progress: \(s.runs.filter { $0.record.state.isFinal }.count) of \(s.planned) runs</span>"
            } else if !s.missing.isEmpty {
                effects = "<span class=\"unknown\">too few finished runs</span>"
            } else if let o = cached {
                let counts = Dictionary(grouping: o.effects, by: \.verdict).map { "\($0.value.count) \($0.key.rawValue)" }.sorted()
                effects = "<a href=\"\(Self.studyPath(s.study.name))\">\(counts.joined(separator: ", "))</a>"
            } else {
                effects = "<a href=\"\(Self.studyPath(s.study.name))\">compute</a>"
            }
            body += "<tr><td><a href=\"\(Self.studyPath(s.study.name))\">\(Self.h(s.study.name))</a></td><td>\(Self.h(s.plan))</td><td>\(Self.h(s.study.factors.map(\.path).joined(separator: " × ")))</td>"
            body += "<td>\(levels)</td><td class=\"num\">\(done.count) of \(s.runs.count) finished (\(s.study.levelNames.count * s.study.repeats) planned)</td><td>\(effects)</td></tr>"
        }
        return body + "</table>"
    }

    /// One study's page: its runs and levels, then its effects (forest plot and estimates, as
    /// study.html shows them), or what is missing before they can be computed.
    func studyPage(_ s: DashboardSession, name: String) throws -> HTTPResponse {
        let studies = dashboardStudies().filter { $0.study.name == name }
        guard !studies.isEmpty else { throw HTTPError(.notFound, "no study \(name) among the runs") }
        var body = ""
        for st in studies {
            let planned = st.study.levelNames.count * st.study.repeats
            let t = now
            let going = st.inProgress(now: t)
            let ended = st.runs.filter { $0.record.state.isFinal }.count
            body += "<h2>Plan \(Self.h(st.plan))</h2>"
            if going {
                body += "<p id=\"inprogress\" class=\"running\">in progress: \(ended) of \(planned) runs, \(DashboardStudy.about(st.secondsLeft(now: t)))</p>"
            } else if st.runs.count < planned {
                body += "<p id=\"endedshort\" class=\"fail\">The study stopped after \(st.runs.count) of its \(planned) planned runs; the others were never submitted.</p>"
            }
            body += "<p>factor <b>\(Self.h(st.study.factors.map(\.path).joined(separator: " × ")))</b>, baseline <b>\(Self.h(st.study.levelNames.first ?? "-"))</b>; \(st.study.levelNames.count) levels × \(st.study.repeats) repeat\(st.study.repeats == 1 ? "" : "s") = \(planned) runs planned. \(Self.h(st.study.labDesign.description)).</p>"
            body += "<table class=\"studyruns\"><tr><th>#</th><th>block</th><th>level</th><th>run</th><th>state</th></tr>"
            var rows = st.runs.map { (r, m) in
                (m.index, "<tr><td class=\"num\">\(m.index + 1)</td><td class=\"num\">\(m.block + 1)</td><td>\(Self.h(m.level))</td><td><a href=\"\(Self.dashboardPath(run: Self.segment(r.id)))\">\(Self.h(r.id))</a></td><td class=\"\(r.state.rawValue)\">\(r.state.rawValue)</td></tr>")
            }
            // The planned runs still to come (or, once the study stopped, never submitted).
            for p in st.plannedOnly {
                let level = p.levels.count == 1 ? Self.h(p.levels[0]) : "one of \(p.levels.map(Self.h).joined(separator: ", "))"
                rows.append((p.index, "<tr class=\"planned\"><td class=\"num\">\(p.index + 1)</td><td class=\"num\">\(p.block + 1)</td><td>\(level)</td><td>–</td><td>\(going ? "planned" : "not submitted")</td></tr>"))
            }
            body += rows.sorted { $0.0 < $1.0 }.map(\.1).joined() + "</table>"
            let done = st.finished
            let short = st.study.levelNames.compactMap { l -> String? in
                let n = done.filter { $0.membership.level == l }.count
                return n < st.study.repeats ? "\(Self.h(l)): \(n) of \(st.study.repeats)" : nil
            }
            // While the study goes on, levels short of their runs are only not there yet; what
            // failed is said at once.
            if going, !st.failed.isEmpty {
                body += "<p id=\"runsfailed\" class=\"fail\">Failed: " + st.failed.map { r, m in "run \(m.index + 1) (\(Self.h(m.level))) \(r.state.rawValue)\(r.message.map { ": \(Self.h($0))" } ?? "")" }.joined(separator: "; ") + ".</p>"
            }
            guard st.missing.isEmpty else {
                if going {
                    body += "<p id=\"toofew\" class=\"small\">The effects are computed once every level has a finished run with its bundle; level\(st.missing.count == 1 ? "" : "s") \(st.missing.map(Self.h).joined(separator: ", ")) \(st.missing.count == 1 ? "has" : "have") none yet.</p>"
                } else {
                    body += "<p id=\"toofew\" class=\"unknown\">Too few finished runs to compare: every level needs at least one finished run with its bundle, and level\(st.missing.count == 1 ? "" : "s") \(st.missing.map(Self.h).joined(separator: ", ")) \(st.missing.count == 1 ? "has" : "have") none (finished runs by level: \(short.joined(separator: "; "))).</p>"
                }
                continue
            }
            if !short.isEmpty && !going { body += "<p class=\"unknown\">Levels short of their planned runs (no verdict on an arm that lost runs): \(short.joined(separator: "; ")).</p>" }
            switch studyOutcome(st) {
            case .failure(let e):
                body += "<p class=\"\(going ? "unknown" : "fail")\">The effects cannot be computed\(going ? " yet" : ""): \(Self.h(e.message))</p>"
            case .success(let o):
                let check = o.checkPassed ? "Arm check passed"
                    : going ? "<span class=\"unknown\">Arm check not passed yet (interim, \(done.count) of \(planned) runs)</span>" : "<span class=\"fail\">Arm check failed (no verdicts)</span>"
                body += "<h3>\(going ? "Interim effects (the study is in progress)" : "Effects")</h3><p>Pairing: <b>\(Self.h(o.pairing))</b>. \(check): \(o.check.prefix(20).map(Self.h).joined(separator: "; "))</p>"
                body += "<p class=\"small\">Change from the baseline (% of its value, log scale) with its 95 % interval; grey: the practical margin.</p><div class=\"forest\">\(StudyReport.forestPlot(o))</div>"
                body += "<div class=\"estimates\">\(StudyReport.estimatesTable(o))</div><p class=\"small\">\(Self.h(o.method))</p>"
            }
        }
        return page("Study \(name)", s, active: "Trends", body: body)
    }
}
