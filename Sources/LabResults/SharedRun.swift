import Foundation
import HeraldAnalysis
import LabHistory

/// One run as the shared store keeps it (issue 41): which lab ran it, on which testbed, plan,
/// variant, settings, firmware and dongle make; its headline figures, verdict and checks; the
/// manifest's identity; where its bundle is; and its summary (summary.json, verbatim). What the
/// outbox holds, one JSON file per run, until the store has it.
public struct SharedRun: Codable, Sendable, Equatable {
    /// The store's row id (nil before it is stored; never in the outbox).
    public var id: Int64?
    public var lab: String
    public var runId: String
    /// The bundle's path on the lab's coordinator, and its URL or path as operators reach it.
    public var path: String
    public var bundleURL: String
    public var testbed: String
    public var plan: String
    public var variant: String
    public var settingsKey: String
    /// The controllers' firmware and makes, where the manifest names them ("" for simulated radios).
    public var firmware: String
    public var dongleMake: String
    public var recordedAt: Date
    /// The manifest's identity: when it was written and the run's seed ("" when none).
    public var createdAt: String
    public var seed: String
    public var devices: Int
    public var detectionPct: Double
    public var continuityPct: Double
    public var heraldContinuityPct: Double
    public var longevity: Double
    public var passed: Bool
    /// `pass`, `fail`, or `infra` (failed with infrastructure faults: not the protocol's fault).
    public var verdict: String
    public var checksTotal: Int
    public var checksFailed: Int
    /// The failed checks' messages, one a line (at most 50).
    public var failedChecks: String
    /// Infrastructure faults (partial nodes, gaps, recoveries); empty: none.
    public var infra: String
    public var summaryJSON: String

    /// Longest lab name (`--lab`).
    public static let maximumLabName = 128

    public init(id: Int64? = nil, lab: String, runId: String, path: String, bundleURL: String, testbed: String, plan: String, variant: String,
                settingsKey: String, firmware: String, dongleMake: String, recordedAt: Date, createdAt: String, seed: String, devices: Int,
                detectionPct: Double, continuityPct: Double, heraldContinuityPct: Double, longevity: Double, passed: Bool, verdict: String,
                checksTotal: Int, checksFailed: Int, failedChecks: String, infra: String, summaryJSON: String) {
        self.id = id; self.lab = lab; self.runId = runId; self.path = path; self.bundleURL = bundleURL; self.testbed = testbed
        self.plan = plan; self.variant = variant; self.settingsKey = settingsKey; self.firmware = firmware; self.dongleMake = dongleMake
        self.recordedAt = recordedAt; self.createdAt = createdAt; self.seed = seed; self.devices = devices; self.detectionPct = detectionPct
        self.continuityPct = continuityPct; self.heraldContinuityPct = heraldContinuityPct; self.longevity = longevity; self.passed = passed
        self.verdict = verdict; self.checksTotal = checksTotal; self.checksFailed = checksFailed; self.failedChecks = failedChecks
        self.infra = infra; self.summaryJSON = summaryJSON
    }

    /// The row of an analysed run of `lab`; `bundleURL`: where operators find its bundle (its path when nil).
    public init(_ r: AnalysisResult, lab: String, bundleURL: String? = nil, at date: Date = Date()) throws {
        let infra = Regression.infrastructure(r)
        let failed = r.checks.filter { !$0.passed }
        let (firmware, make) = Self.controllers(r.input.controllers ?? [:])
        self.init(lab: lab, runId: r.input.runId ?? URL(fileURLWithPath: r.input.path).lastPathComponent, path: r.input.path,
                  bundleURL: bundleURL ?? r.input.path, testbed: r.input.testbed ?? "", plan: r.input.plan ?? "", variant: r.input.variant ?? "",
                  settingsKey: HistoryStore.settingsKey(r), firmware: firmware, dongleMake: make, recordedAt: date,
                  createdAt: r.input.createdAt ?? "", seed: r.input.seed.map(String.init) ?? "", devices: r.devices.count,
                  detectionPct: r.strict.detectionpct, continuityPct: r.strict.continuitypct, heraldContinuityPct: r.herald.continuitypct,
                  longevity: r.strict.longevity, passed: r.passed, verdict: r.passed ? "pass" : (infra.isEmpty ? "fail" : "infra"),
                  checksTotal: r.checks.count, checksFailed: failed.count,
                  failedChecks: failed.prefix(50).map { "\($0.name) \($0.subject): \($0.message)" }.joined(separator: "\n"),
                  infra: infra.joined(separator: "; "), summaryJSON: String(decoding: try ReportWriter.summaryJSON(r), as: UTF8.self))
        try validate()
    }

    /// The controllers' firmware ("LMP 9.8870") and makes (manufacturerName, else the company id),
    /// each distinct value once, sorted: from the manifest's `key=value` identities.
    static func controllers(_ byNode: [String: String]) -> (firmware: String, make: String) {
        var firmware = Set<String>(), makes = Set<String>()
        for text in byNode.values {
            // Values may hold spaces ("Cambridge Silicon Radio"): a word without `=` continues the value before.
            var fields = [String: String](), key: String?
            for word in text.split(separator: " ") {
                if let eq = word.firstIndex(of: "="), word[..<eq].allSatisfy({ $0.isLetter }) {
                    key = String(word[..<eq]); fields[key!] = String(word[word.index(after: eq)...])
                } else if let k = key { fields[k, default: ""] += " " + word }
            }
            if let v = fields["lmpVersion"], let s = fields["lmpSubversion"] { firmware.insert("LMP \(v).\(s)") }
            if let name = fields["manufacturerName"] { makes.insert(name) } else if let id = fields["manufacturer"] { makes.insert("company \(id)") }
        }
        return (firmware.sorted().joined(separator: "; "), makes.sorted().joined(separator: "; "))
    }

    /// Refuses what PostgreSQL's text cannot hold (a NUL) and a lab name that is empty or too long,
    /// naming the field.
    public func validate() throws {
        let lab = self.lab
        guard !lab.isEmpty else { throw ResultsStoreError.refused("lab: empty (--lab NAME)") }
        guard lab.count <= Self.maximumLabName else { throw ResultsStoreError.refused("lab: over \(Self.maximumLabName) characters") }
        guard !runId.isEmpty else { throw ResultsStoreError.refused("run id: empty") }
        let fields: [(String, String)] = [("lab", lab), ("run id", runId), ("path", path), ("bundle URL", bundleURL), ("testbed", testbed), ("plan", plan),
                                          ("variant", variant), ("settings", settingsKey), ("firmware", firmware), ("dongle make", dongleMake),
                                          ("createdAt", createdAt), ("seed", seed), ("verdict", verdict), ("failed checks", failedChecks),
                                          ("infra", infra), ("summary", summaryJSON)]
        for (name, value) in fields where value.utf8.contains(0) {
            throw ResultsStoreError.refused("\(name): holds a NUL character, which PostgreSQL's text cannot store")
        }
    }

    /// The run's summary, decoded.
    public func summary() throws -> AnalysisResult {
        let d = JSONDecoder()
        d.nonConformingFloatDecodingStrategy = .convertFromString(positiveInfinity: "inf", negativeInfinity: "-inf", nan: "nan")
        return try d.decode(AnalysisResult.self, from: Data(summaryJSON.utf8))
    }

    /// The outbox's encoding (NaN figures as "nan", as summary.json writes them).
    static func encoder() -> JSONEncoder {
        let e = JSONEncoder()
        e.nonConformingFloatEncodingStrategy = .convertToString(positiveInfinity: "inf", negativeInfinity: "-inf", nan: "nan")
        e.dateEncodingStrategy = .secondsSince1970
        e.outputFormatting = [.sortedKeys]
        return e
    }

    static func decoder() -> JSONDecoder {
        let d = JSONDecoder()
        d.nonConformingFloatDecodingStrategy = .convertFromString(positiveInfinity: "inf", negativeInfinity: "-inf", nan: "nan")
        d.dateDecodingStrategy = .secondsSince1970
        return d
    }
}

public enum ResultsStoreError: Error, CustomStringConvertible, Equatable, Sendable {
    case badURL(String)
    case passwordFile(String)
    /// The database's schema is newer than this herald-lab's: refused, never written over.
    case newerSchema(database: Int, code: Int)
    /// The database's schema is older and this role cannot migrate it.
    case needsMigration(database: Int, code: Int, reason: String)
    case refused(String)
    /// The store could not be reached or answered with an error (its message and SQLSTATE; never a password).
    case database(String)
    case outbox(String)
    /// The server refused this row for its data (SQLSTATE class 22 or 23): sending it again
    /// cannot help, so the outbox sets it aside.
    case rowRefused(String)

    public var description: String {
        switch self {
        case .badURL(let s): return "--history: \(s)"
        case .passwordFile(let s): return "password file \(s)"
        case .newerSchema(let db, let code):
            return "the results store's schema is at version \(db), newer than this herald-lab's (\(code)): refused; upgrade herald-lab on this machine (docs/RESULTS-SERVER.md)"
        case .needsMigration(let db, let code, let reason):
            return "the results store's schema is at version \(db) and this herald-lab needs \(code), but this role cannot migrate it (\(reason)); run herald-lab once as the store's owner role (docs/RESULTS-SERVER.md)"
        case .refused(let s): return "not stored: \(s)"
        case .database(let s): return "results store: \(s)"
        case .outbox(let s): return "history outbox: \(s)"
        case .rowRefused(let s): return "results store refused the row: \(s)"
        }
    }
}
