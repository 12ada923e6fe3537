import Foundation
import Hummingbird
import Synchronization
import HeraldAnalysis
import HeraldCore
import LabHTTP
import LabPlan

/// What the dashboard keeps of the studies among the coordinator's runs: each run's `studyRun`
/// (read once from its plan text) and each study's comparison, kept while the set of its
/// finished runs is the same (a bootstrap per page load would cost seconds).
final class StudyCache: Sendable {
    /// Memberships by run id, and comparisons by study, under one lock.
    private struct Kept {
        var memberships: [String: StudyMembership?] = [:]
        var outcomes: [String: (runs: [String], outcome: Result<Comparison.Outcome, StudyCompareError>)] = [:]
    }
    private let kept = Mutex(Kept())

    func membership(_ r: RunRecord) -> StudyMembership? {
        if let known = kept.withLock({ $0.memberships[r.id] }) { return known }
        // The text was checked when the run was submitted; one that no longer parses (an older
        // coordinator's) is in no study.
        let m: StudyMembership?
        do { m = try Plan.parse(yaml: r.planText, source: "run \(r.id)").studyRun } catch { m = nil }
        kept.withLock { $0.memberships[r.id] = m }
        return m
    }

    /// Sets what a run's membership is taken to be (tests: a membership no plan parser would
    /// let through, as a store written by an older coordinator could hold).
    func remember(_ id: String, _ m: StudyMembership?) {
        kept.withLock { $0.memberships[id] = m }
    }

    /// The study's comparison for exactly these runs: the cached one, or `compute`'s (cached).
    func outcome(_ key: String, runs: [String], compute: () -> Result<Comparison.Outcome, StudyCompareError>) -> Result<Comparison.Outcome, StudyCompareError> {
        if let c = kept.withLock({ $0.outcomes[key] }), c.runs == runs { return c.outcome }
        let o = compute()
        kept.withLock { $0.outcomes[key] = (runs, o) }
        return o
    }

    func cached(_ key: String, runs: [String]) -> Comparison.Outcome? {
        kept.withLock { k in
            guard let c = k.outcomes[key], c.runs == runs, case .success(let o) = c.outcome else { return nil }
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

extension Dashboard {
    /// The studies among the coordinator's runs, newest first.
    func dashboardStudies() -> [DashboardStudy] {
        let all = withLock { s in Array(s.runs.values) }
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

    /// The Trends page's list of studies (studies.mustache): runs and levels of each, a link to its effects.
    func studiesContext() -> [String: Any] {
        let studies = dashboardStudies()
        let rows = studies.prefix(50).map { s -> [String: Any] in
            let done = s.finished
            let cached = dashboard.studies.cached(s.key, runs: done.map(\.record.id).sorted())
            let href = Self.studyPath(s.study.name)
            var row: [String: Any] = [
                "href": href, "name": s.study.name, "plan": s.plan, "factor": s.study.factors.map(\.path).joined(separator: " × "),
                "levels": s.study.levelNames.map { l in ["name": l, "done": done.filter { $0.membership.level == l }.count, "repeats": s.study.repeats] as [String: Any] },
                "finished": done.count, "submitted": s.runs.count, "planned": s.study.levelNames.count * s.study.repeats,
            ]
            if s.inProgress(now: now) {
                row["progress"] = ["ended": s.runs.filter { $0.record.state.isFinal }.count, "planned": s.planned]
            } else if !s.missing.isEmpty {
                row["tooFew"] = true
            } else if let o = cached {
                let counts = Dictionary(grouping: o.effects, by: \.verdict).map { "\($0.value.count) \($0.key.rawValue)" }.sorted()
                row["effects"] = ["href": href, "counts": counts.joined(separator: ", ")]
            } else {
                row["compute"] = ["href": href]
            }
            return row
        }
        return ["studies": Array(rows), "hasStudies": !rows.isEmpty]
    }

    /// One study's page: its runs and levels, then its effects (forest plot and estimates, as
    /// study.html shows them), or what is missing before they can be computed.
    func studyPage(_ s: DashboardSession, name: String) throws -> Response {
        let studies = dashboardStudies().filter { $0.study.name == name }
        guard !studies.isEmpty else { throw LabRefusal(.notFound, "no study \(name) among the runs") }
        var plans = [[String: Any]]()
        for st in studies {
            let planned = st.study.levelNames.count * st.study.repeats
            let t = now
            let going = st.inProgress(now: t)
            let ended = st.runs.filter { $0.record.state.isFinal }.count
            var c: [String: Any] = [
                "plan": st.plan, "going": going, "ended": ended, "planned": planned, "left": DashboardStudy.about(st.secondsLeft(now: t)),
                "stoppedShort": !going && st.runs.count < planned, "submitted": st.runs.count,
                "factor": st.study.factors.map(\.path).joined(separator: " × "), "baseline": st.study.levelNames.first ?? "-",
                "levelCount": st.study.levelNames.count, "repeats": st.study.repeats, "oneRepeat": st.study.repeats == 1, "design": st.study.labDesign.description,
            ]
            var rows: [(Int, [String: Any])] = st.runs.map { (r, m) in
                (m.index, ["submittedRun": ["number": m.index + 1, "block": m.block + 1, "level": m.level, "href": Self.dashboardPath(run: Self.segment(r.id)),
                                            "id": r.id, "state": r.state.rawValue] as [String: Any]] as [String: Any])
            }
            // The planned runs still to come (or, once the study stopped, never submitted).
            for p in st.plannedOnly {
                rows.append((p.index, ["plannedRun": mustacheContext(["number": p.index + 1, "block": p.block + 1, "one": p.levels.count == 1 ? p.levels[0] : nil,
                                                                      "levels": p.levels, "what": going ? "planned" : "not submitted"])] as [String: Any]))
            }
            c["rows"] = rows.sorted { $0.0 < $1.0 }.map(\.1)
            let done = st.finished
            let short = st.study.levelNames.compactMap { l -> String? in
                let n = done.filter { $0.membership.level == l }.count
                return n < st.study.repeats ? "\(l): \(n) of \(st.study.repeats)" : nil
            }
            c["short"] = short
            // While the study goes on, levels short of their runs are only not there yet; what
            // failed is said at once.
            if going, !st.failed.isEmpty {
                c["hasFailed"] = true
                c["failed"] = st.failed.map { r, m in mustacheContext(["number": m.index + 1, "level": m.level, "state": r.state.rawValue, "message": r.message]) }
            }
            guard st.missing.isEmpty else {
                c["missing"] = ["one": st.missing.count == 1, "levels": st.missing] as [String: Any]
                plans.append(c)
                continue
            }
            c["shortLevels"] = !short.isEmpty && !going
            switch studyOutcome(st) {
            case .failure(let e):
                c["cannot"] = ["cls": going ? "unknown" : "fail", "message": e.message]
            case .success(let o):
                c["outcome"] = [
                    "heading": going ? "Interim effects (the study is in progress)" : "Effects", "pairing": o.pairing,
                    "passed": o.checkPassed, "interim": !o.checkPassed && going, "failedCheck": !o.checkPassed && !going, "done": done.count,
                    "check": Array(o.check.prefix(20)),
                    // Markup StudyReport builds from numbers, every label escaped there (OutsideText.html).
                    "forest": StudyReport.forestPlot(o, inlineStyle: false), "estimates": StudyReport.estimatesTable(o), "method": o.method,
                ] as [String: Any]
            }
            plans.append(c)
        }
        return page("study", "Study \(name)", s, active: "Trends", ["plans": plans])
    }
}
