import ArgumentParser
import Foundation
import HeraldCore
import LabPlan

/// `herald-lab plan check PLAN`: validate a plan and print it as parsed.
struct PlanCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "plan",
        abstract: "Check test plans.",
        subcommands: [Check.self]
    )

    struct Check: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Validate a plan; print the nodes and settings it gives, or every problem with its field path (exit 2).")

        @Argument(help: "Plan file (YAML).")
        var plan: String

        @Option(help: ArgumentHelp("The plan as parsed (every default filled in) and a study's run order, as JSON to FILE (--json alone or --json -: standard output, instead of the text).", valueName: "FILE"))
        var json: String?

        /// --json: the plan as parsed, what it needs of a lab, and a study's runs in order.
        struct Checked: Encodable {
            struct Run: Encodable { var index, block: Int; var level: String; var seed: UInt64; var folder: String }
            var plan: Plan
            /// What a lab run needs (`AgentNeeds`): one entry, or one per set of a study's levels
            /// that need different agents; empty when the plan cannot run on a lab (personas).
            var needs: [AgentNeeds]
            var runs: [Run]?
        }

        /// What a lab must offer for the plan (a study: each of its runs), nil when a lab cannot
        /// run it at all (personas are simulated phones).
        static func needs(_ plan: Plan, runs: [StudyRun]?) -> [AgentNeeds] {
            guard plan.nodes.allSatisfy({ $0.persona == nil }) else { return [] }
            return runs.map { Plan.needs(of: $0) } ?? [plan.needs]
        }

        /// `plan check`'s lines on what a lab needs for the plan.
        static func needsLines(_ needs: [AgentNeeds]) -> [String] {
            guard !needs.isEmpty else { return ["  on a lab: not runnable (nodes with personas are simulated phones: herald-lab simulate runs them)"] }
            return needs.map { n in
                let spares = n.spares > 0 ? ", and up to \(n.spares) more as spares (checked with them, each standing in for a dongle that fails its pre-flight)" : ""
                return "  needs on a lab: \(n)\(spares)" + (n.levels.map { " (level\($0.count == 1 ? "" : "s") \($0.joined(separator: "; ")))" } ?? "")
            }
        }

        /// The --json document.
        static func checked(_ plan: Plan, text: String, source: String) throws(PlanError) -> Checked {
            var runs: [StudyRun]?
            if plan.study != nil { runs = try Plan.expandStudy(yaml: text, source: source).runs }
            return Checked(plan: plan, needs: needs(plan, runs: runs),
                           runs: runs?.map { Checked.Run(index: $0.index, block: $0.block, level: $0.level, seed: $0.seed, folder: $0.folder) })
        }

        func run() throws {
            let (plan, text) = try loadPlanWithText(self.plan)
            if let json {
                let checked: Checked
                do { checked = try Self.checked(plan, text: text, source: self.plan) } catch {
                    FileHandle.standardError.write(Data((error.description + "\n").utf8))
                    throw ExitCode(2)
                }
                let e = JSONEncoder()
                e.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
                e.nonConformingFloatEncodingStrategy = .convertToString(positiveInfinity: "inf", negativeInfinity: "-inf", nan: "nan")
                let data: Data
                do { data = try e.encode(checked) } catch { log("herald-lab plan check: cannot encode the plan: \(error)"); throw ExitCode(2) }
                try CLIConventions.writeJSON(data, to: json, command: "plan check")
                if json == "-" { return }
            }
            print("\(plan.name): \(plan.nodes.count) nodes, \(formatDuration(plan.duration)) (warm-up \(formatDuration(plan.warmup))), radio \(plan.radio.kind.rawValue)")
            for n in plan.nodes {
                print("  \(n.name)\tidentifier \(n.identifier)\tshortName \(n.shortName)\tat \(n.position)" + (n.persona.map { "\tpersona \($0.rawValue)" } ?? ""))
            }
            let s = plan.sensor
            print("  sensor: scan \(formatDuration(s.scanOn)) on / \(formatDuration(s.scanRest)) rest / \(formatDuration(s.scanOff)) off, advert every \(formatDuration(s.advertInterval)), tx \(s.txPower) dBm, pseudo address \(s.pseudoAddress ? "on" : "off")")
            for g in plan.groups ?? [] {
                let set = g.set.keys.sorted().map { "\($0)=\(g.set[$0]!)" }.joined(separator: ", ")
                print("  group \(g.name) (\(g.nodes.count) nodes: \(g.nodes.prefix(8).joined(separator: ", "))\(g.nodes.count > 8 ? ", …" : "")): \(set.isEmpty ? "the plan's settings" : set)")
            }
            guard let study = plan.study else {
                for l in Self.needsLines(Self.needs(plan, runs: nil)) { print(l) }
                return
            }
            let runs: [StudyRun]
            do { runs = try Plan.expandStudy(yaml: text, source: self.plan).runs } catch {
                FileHandle.standardError.write(Data((error.description + "\n").utf8))
                throw ExitCode(2)
            }
            for l in Self.needsLines(Self.needs(plan, runs: runs)) { print(l) }
            let levels = Set(runs.map(\.level)).count
            print("study \(study.name): \(study.factors.map { "\($0.path) in [\($0.levels.joined(separator: ", "))]" }.joined(separator: " × ")), \(levels) level\(levels == 1 ? "" : "s") × \(study.repeats) repeats = \(runs.count) runs (\(formatDuration(plan.duration * Double(runs.count))) simulated)")
            print("  on a lab (herald-lab run): \(study.labDesign.description)")
            if !study.margins.isEmpty { print("  margins: " + study.margins.keys.sorted().map { "\($0) ±\(study.margins[$0]!)" }.joined(separator: ", ")) }
            print("  order (seeded, interleaved blocks):")
            for r in runs { print("    \(r.folder)  block \(r.block + 1)  \(r.level)  seed \(r.seed)") }
        }
    }
}

/// Loads a plan or exits 2 with every problem and its field path.
func loadPlan(_ path: String) throws -> Plan { try loadPlanWithText(path).plan }

/// The plan and the text it was read from (read once), or exit 2 with every problem.
func loadPlanWithText(_ path: String) throws -> (plan: Plan, text: String) {
    do {
        let text = try Plan.readText(path: path)
        return (try Plan.parse(yaml: text, source: path), text)
    } catch {
        FileHandle.standardError.write(Data((error.description + "\n").utf8))
        throw ExitCode(2)
    }
}

/// A duration as 1h2m3s (ms below 1 s). A duration from outside (a coordinator's run record) can
/// be anything: NaN and infinities are –, values beyond Int64's range are written as they are
/// (issue 36).
func formatDuration(_ seconds: TimeInterval) -> String {
    guard seconds.isFinite else { return "–" }
    guard abs(seconds) < 9.2e18 else { return "\(seconds)s" }
    if seconds == 0 { return "0s" }
    if seconds < 1 { return "\(Saturating.int((seconds * 1000).rounded()))ms" }
    var s = Saturating.int(seconds.rounded())
    var parts = [String]()
    if s >= 3600 { parts.append("\(s / 3600)h"); s %= 3600 }
    if s >= 60 { parts.append("\(s / 60)m"); s %= 60 }
    if s > 0 || parts.isEmpty { parts.append("\(s)s") }
    return parts.joined()
}
