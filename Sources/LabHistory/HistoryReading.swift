import Foundation
import HeraldAnalysis

/// One stored run as the readers of history see it (`history`, `compare`, the dashboard's
/// Trends), from either store: the local SQLite history (one lab, `lab` empty) or the shared
/// results store (issue 41, every lab's rows, each naming its lab).
public struct LabRun: Sendable {
    /// The lab that ran it ("" in a local history.sqlite: this machine's own lab).
    public var lab: String
    public var run: HistoryStore.Run
    /// The controllers' makes where the store keeps them ("" when unknown).
    public var dongleMake: String
    public init(lab: String, run: HistoryStore.Run, dongleMake: String = "") {
        self.lab = lab
        self.run = run
        self.dongleMake = dongleMake
    }
}

extension HistoryStore.Run {
    /// A row made outside LabHistory (the shared store's, a test's).
    public static func make(id: Int64?, recordedAt: String, runId: String, path: String, plan: String, variant: String, devices: Int,
                            detectionPct: Double, continuityPct: Double, heraldContinuityPct: Double, longevity: Double, passed: Bool,
                            reportPath: String, summaryJSON: String, settingsKey: String = "", testbed: String = "", infra: String = "", aborted: Bool = false) -> Self {
        Self(id: id, recordedAt: recordedAt, runId: runId, path: path, plan: plan, variant: variant, devices: devices, detectionPct: detectionPct,
             continuityPct: continuityPct, heraldContinuityPct: heraldContinuityPct, longevity: longevity, passed: passed, reportPath: reportPath,
             summaryJSON: summaryJSON, settingsKey: settingsKey, testbed: testbed, infra: infra, aborted: aborted)
    }

    /// The run's stored summary, decoded.
    public func decodedSummary() throws -> AnalysisResult {
        let d = JSONDecoder()
        d.nonConformingFloatDecodingStrategy = .convertFromString(positiveInfinity: "inf", negativeInfinity: "-inf", nan: "nan")
        return try d.decode(AnalysisResult.self, from: Data(summaryJSON.utf8))
    }
}

/// What the readers of history need, from the local SQLite history or the shared results
/// store alike, so each reader has one code path. `labs` empty: every lab; the local history
/// holds one lab only and has no names (it refuses a lab filter: `--lab` goes with `--history`).
public protocol HistoryReading: Sendable {
    /// Where the history is, as said to people (never with a password).
    var historyName: String { get }
    /// Whether rows name their labs (the shared store), so a lab filter means something.
    var namesLabs: Bool { get }
    /// The labs with runs, by name ([] for the local history).
    func historyLabs() async throws -> [String]
    /// The plans with runs of these labs, by name.
    func historyPlans(labs: [String]) async throws -> [String]
    /// The runs of these labs (optionally of one plan), in the order stored; only the newest
    /// `last` when given (what a page shows, bounded however long the history grows).
    func historyRuns(labs: [String], plan: String?, last: Int?) async throws -> [LabRun]
    /// Each testbed's infra rate over its last `last` runs: of one lab when one is given (by
    /// testbed), of several as `lab/testbed`.
    func historyInfraRates(labs: [String], last: Int) async throws -> [HistoryStore.InfraRate]
}

extension HistoryReading {
    /// Every run of these labs (optionally of one plan), in the order stored.
    public func historyRuns(labs: [String], plan: String?) async throws -> [LabRun] {
        try await historyRuns(labs: labs, plan: plan, last: nil)
    }
}

extension HistoryStore: HistoryReading {
    public var historyName: String { path }
    public var namesLabs: Bool { false }
    public func historyLabs() async throws -> [String] { [] }
    public func historyPlans(labs: [String]) async throws -> [String] { try plans() }
    public func historyRuns(labs: [String], plan: String?, last: Int?) async throws -> [LabRun] {
        let all = try runs(plan: plan).map { LabRun(lab: "", run: $0) }
        return last.map { Array(all.suffix(max(1, $0))) } ?? all
    }
    public func historyInfraRates(labs: [String], last: Int) async throws -> [InfraRate] { try infraRates(last: last) }
}

/// Lab names as a reader gives them (`--lab` of history, regress, compare; the dashboard's
/// `lab` query parameter). The store keeps any name of 1 to 128 characters without NUL
/// (bound, never spliced into SQL); a reader's filter also refuses control and format
/// characters, and the dashboard's refuses what is not a letter, digit, space or one of `._-+@:/()#,`
/// (a name like that is still read with the CLI's --lab).
public enum LabName {
    public static let maximumLength = 128
    static let punctuation = Set("._-+@:/()#, ".unicodeScalars)

    /// Why `name` cannot be a `--lab` filter, or nil.
    public static func problem(_ name: String) -> String? {
        if name.isEmpty { return "empty" }
        if name.count > maximumLength { return "over \(maximumLength) characters" }
        if name.unicodeScalars.contains(where: { [.control, .format, .surrogate, .unassigned, .privateUse].contains($0.properties.generalCategory) }) {
            return "holds control or format characters"
        }
        return nil
    }

    /// Why `name` cannot be the dashboard's `lab` parameter, or nil.
    public static func queryProblem(_ name: String) -> String? {
        if let p = problem(name) { return p }
        if name.first == " " || name.last == " " { return "starts or ends with a space" }
        if let bad = name.unicodeScalars.first(where: { !(punctuation.contains($0) || $0.properties.isAlphabetic || $0.properties.numericType != nil) }) {
            return "holds \(bad.value < 0x80 ? "'\(Character(bad))'" : String(format: "U+%04X", bad.value)): a lab name here is letters, digits, spaces and ._-+@:/()#,"
        }
        return nil
    }
}

/// Two (or more) labs' nightly series of one plan as a comparison (issue 41: `compare --history
/// … --lab A --lab B --plan P`): each lab a level (the first the baseline), its last `last`
/// clean runs (neither aborted nor with infrastructure faults) the runs, so the comparison
/// resamples nights and each night's devices (dongles), as it does a study's runs.
public enum CrossLabComparison {
    public enum Problem: Error, CustomStringConvertible, Equatable {
        /// A lab's runs of the plan are of several variants: one must be chosen (--variant).
        case variants(lab: String, [String])
        /// A lab has no clean run of the plan (and variant).
        case noRuns(lab: String)
        public var description: String {
            switch self {
            case .variants(let lab, let v):
                return "lab \(Format.label(lab))'s runs of the plan are of \(v.count) variants (\(v.map { Format.label($0.isEmpty ? "(none)" : $0) }.joined(separator: ", "))): choose one with --variant"
            case .noRuns(let lab): return "--lab \(Format.label(lab)): no clean run of the plan"
            }
        }
    }

    public static func design(plan: String, labs: [String], variant: String?, last: Int, reader: any HistoryReading) async throws -> Comparison.Design {
        var levels = [Comparison.Level]()
        for lab in labs {
            var runs = try await reader.historyRuns(labs: [lab], plan: plan).filter { $0.run.isClean }
            if let variant { runs = runs.filter { $0.run.variant == variant } }
            let variants = Set(runs.map(\.run.variant))
            if variants.count > 1 { throw Problem.variants(lab: lab, variants.sorted()) }
            runs = Array(runs.suffix(max(1, last)))
            guard !runs.isEmpty else { throw Problem.noRuns(lab: lab) }
            let refs = try runs.map { r -> Comparison.RunRef in
                let result = try r.run.decodedSummary()
                return Comparison.RunRef(result: result, label: "\(lab)/\(r.run.runId)", settings: Comparison.settings(result))
            }
            levels.append(Comparison.Level(name: lab, runs: refs))
        }
        return Comparison.Design(factor: "lab", levels: levels)
    }
}
