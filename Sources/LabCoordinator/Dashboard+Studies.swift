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
            if !s.missing.isEmpty {
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
            body += "<h2>Plan \(Self.h(st.plan))</h2><p>factor <b>\(Self.h(st.study.factors.map(\.path).joined(separator: " × ")))</b>, baseline <b>\(Self.h(st.study.levelNames.first ?? "-"))</b>; \(st.study.levelNames.count) levels × \(st.study.repeats) repeat\(st.study.repeats == 1 ? "" : "s") = \(planned) runs planned. \(Self.h(st.study.labDesign.description)).</p>"
            body += "<table class=\"studyruns\"><tr><th>#</th><th>block</th><th>level</th><th>run</th><th>state</th></tr>"
            for (r, m) in st.runs {
                body += "<tr><td class=\"num\">\(m.index + 1)</td><td class=\"num\">\(m.block + 1)</td><td>\(Self.h(m.level))</td><td><a href=\"\(Self.dashboardPath(run: Self.segment(r.id)))\">\(Self.h(r.id))</a></td><td class=\"\(r.state.rawValue)\">\(r.state.rawValue)</td></tr>"
            }
            body += "</table>"
            let done = st.finished
            let short = st.study.levelNames.compactMap { l -> String? in
                let n = done.filter { $0.membership.level == l }.count
                return n < st.study.repeats ? "\(Self.h(l)): \(n) of \(st.study.repeats)" : nil
            }
            guard st.missing.isEmpty else {
                body += "<p id=\"toofew\" class=\"unknown\">Too few finished runs to compare: every level needs at least one finished run with its bundle, and level\(st.missing.count == 1 ? "" : "s") \(st.missing.map(Self.h).joined(separator: ", ")) \(st.missing.count == 1 ? "has" : "have") none (finished runs by level: \(short.joined(separator: "; "))).</p>"
                continue
            }
            if !short.isEmpty { body += "<p class=\"unknown\">Levels short of their planned runs (no verdict on an arm that lost runs): \(short.joined(separator: "; ")).</p>" }
            switch studyOutcome(st) {
            case .failure(let e):
                body += "<p class=\"fail\">The effects cannot be computed: \(Self.h(e.message))</p>"
            case .success(let o):
                body += "<h3>Effects</h3><p>Pairing: <b>\(Self.h(o.pairing))</b>. \(o.checkPassed ? "Arm check passed" : "<span class=\"fail\">Arm check failed (no verdicts)</span>"): \(o.check.prefix(20).map(Self.h).joined(separator: "; "))</p>"
                body += "<p class=\"small\">Change from the baseline (% of its value, log scale) with its 95 % interval; grey: the practical margin.</p><div class=\"forest\">\(StudyReport.forestPlot(o))</div>"
                body += "<div class=\"estimates\">\(StudyReport.estimatesTable(o))</div><p class=\"small\">\(Self.h(o.method))</p>"
            }
        }
        return page("Study \(name)", s, active: "Trends", body: body)
    }
}
