import Foundation
import HeraldCore
#if canImport(Glibc)
import Glibc
#endif

/// What to analyse and how: windows, shifts, thresholds. Times are seconds since 1970 in the
/// logs' own time base (wall clock; HeraldLab nodes write UTC).
public struct AnalysisOptions: Sendable {
    public var ceStart: Double?
    public var ceEnd: Double?
    public var filterStart: Double?
    public var filterEnd: Double?
    /// Seconds to add to a device's times, by folder name or shortName.
    public var timeshifts: [String: Double] = [:]
    public var thresholds: AnalysisThresholds?
    /// Threads reading device folders (default: every core, at most 8); the figures are the
    /// same for any number.
    public var threads = min(8, max(1, ProcessInfo.processInfo.activeProcessorCount))
    public init() {}
}

/// Pass/fail limits (a plan's `thresholds`).
public struct AnalysisThresholds: Codable, Sendable, Equatable {
    public var detectionPct: Double = 100
    public var continuityPct: Double = 90
    public var pairContinuityPct: Double = 80
    public var timeToFirstDetection: Double = 60
    public var timeToFirstRead: Double = 120
    public var regressionTolerancePct: Double = 2
    public init() {}
    public init(from decoder: Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let d = AnalysisThresholds.init()
        detectionPct = try c.decodeIfPresent(Double.self, forKey: .detectionPct) ?? d.detectionPct
        continuityPct = try c.decodeIfPresent(Double.self, forKey: .continuityPct) ?? d.continuityPct
        pairContinuityPct = try c.decodeIfPresent(Double.self, forKey: .pairContinuityPct) ?? d.pairContinuityPct
        timeToFirstDetection = try c.decodeIfPresent(Double.self, forKey: .timeToFirstDetection) ?? d.timeToFirstDetection
        timeToFirstRead = try c.decodeIfPresent(Double.self, forKey: .timeToFirstRead) ?? d.timeToFirstRead
        regressionTolerancePct = try c.decodeIfPresent(Double.self, forKey: .regressionTolerancePct) ?? d.regressionTolerancePct
    }
}

/// One device folder to analyse.
public struct DeviceInput: Sendable {
    public var folder: String
    public var url: URL
    /// From detection.csv (or the manifest).
    public var model: String
    public var os: String
    public var osVersion: String
    public var shortName: String
    /// Seconds added to this device's times (flags), minus its clock offset (bundles).
    public var shift: Double
    public var problems: [String]
    /// The analysed folder: files are read only if they resolve inside it (`LogFileAccess`).
    public var root: URL? = nil
}

/// Ranges every number from a flag, a manifest or a file must fall in before any arithmetic.
public enum InputLimits {
    /// Largest time shift or clock offset, seconds (100 years: a device clock reset to 1970 is
    /// still representable; anything larger is corrupt).
    public static let maximumShift: Double = 100 * 366 * 86400
    /// Times (flags, manifests, log rows): years 1970 to 9999.
    public static let earliestTime: Double = 0
    public static let latestTime: Double = 253_402_300_799 // 9999-12-31 23:59:59
    /// Longest contact event, seconds (366 days; Herald's tests last hours).
    public static let maximumContactEvent: Double = 366 * 86400
    /// Device folders in one analysis (pairs grow with the square).
    public static let maximumDevices = 1000
    /// manifest.json and summary.json are read whole up to this size.
    public static let maximumJSONBytes: Int64 = 64 << 20

    /// A problem with a shift or offset, or nil.
    public static func shiftProblem(_ v: Double) -> String? {
        guard v.isFinite else { return "\(v) is not a number of seconds" }
        guard abs(v) <= maximumShift else { return "\(v) s is out of range (at most ±\(Int(maximumShift)) s, 100 years)" }
        return nil
    }
    /// A problem with a time (seconds since 1970), or nil.
    public static func timeProblem(_ v: Double) -> String? {
        guard v.isFinite else { return "\(v) is not a time" }
        guard v >= earliestTime, v <= latestTime else { return "is out of range (years 1970 to 9999)" }
        return nil
    }
}

/// The manifest fields the analyser needs (docs/BUNDLE.md), read leniently.
struct BundleManifest: Decodable {
    struct Window: Decodable { var start: String; var end: String }
    struct Node: Decodable {
        var name: String
        var shortName: String?
        var os: String?
        var osVersion: String?
        var clockOffset: Double?
        /// Not one of the states the coordinator writes: the manifest does not decode.
        var state: BundleNodeState?
        var controller: [String: String]?
        // For the report only, so loose: any JSON (ReportContext reads what it can).
        var position: JSONValue?
        var gaps: JSONValue?
        var message: JSONValue?
        var persona: JSONValue?
        var recoveries: [JSONValue]?
        /// The dongle and the agent that ran the node (lab runs): the device's identity across runs.
        var dongle: JSONValue?
        var agent: JSONValue?

        /// What stands for the physical device across runs (compare draws it once for all its
        /// runs): its dongle's address, else the dongle's label, else the agent; nil: none recorded.
        var unit: String? {
            func field(_ v: JSONValue?, _ key: String) -> String? {
                guard case .object(let o)? = v, case .string(let s)? = o[key], !s.isEmpty else { return nil }
                return String(s.prefix(200))
            }
            if let id = field(dongle, "id") { return "dongle \(id)" }
            if let name = field(dongle, "name") { return "dongle \(name)" }
            if let a = field(agent, "name") { return "agent \(a)" }
            return nil
        }
    }
    struct PlanPart: Decodable {
        var name: String?
        var variant: String?
        var warmup: Double?
        var duration: Double?
        var thresholds: AnalysisThresholds?
        var sensor: [String: JSONValue]?
        // For the report only, so loose: any JSON.
        var description: JSONValue?
        var radio: [String: JSONValue]?
        var nodes: [PlanNode]?
    }
    /// A plan node's group and its own sensor settings (A/B in one run).
    struct PlanNode: Decodable {
        var name: String
        var group: String?
        var sensor: [String: JSONValue]?
        /// The plan's power schedule of the node (`{off, on}`; no `on`: off for good).
        var power: [JSONValue]?
        /// The plan switches the node off and never on again: its shorter logs are the test's
        /// condition, not a fault (issue 38).
        var offForGood: Bool {
            (power ?? []).contains { p in
                guard case .object(let o) = p, o["off"] != nil else { return false }
                if case .null? = o["on"] { return true }
                return o["on"] == nil
            }
        }
    }
    var runId: String?
    var mode: BundleMode?
    var seed: UInt64?
    var createdAt: String?
    var contactEvent: Window?
    var nodes: [Node]?
    var plan: PlanPart?
    var software: [String: String]?
    var planText: JSONValue?
    /// An operator aborted the run (the coordinator writes it): no verdict.
    var aborted: Bool?
}

/// A loose JSON value (sensor settings are shown, compared and stored, not interpreted).
public enum JSONValue: Codable, Sendable, Equatable, CustomStringConvertible {
    case number(Double), string(String), bool(Bool), null, array([JSONValue]), object([String: JSONValue])
    public init(from decoder: Decoder) throws {
        let c = try decoder.singleValueContainer()
        if c.decodeNil() { self = .null }
        else if let b = try? c.decode(Bool.self) { self = .bool(b) }
        else if let n = try? c.decode(Double.self) { self = .number(n) }
        else if let s = try? c.decode(String.self) { self = .string(s) }
        else if let a = try? c.decode([JSONValue].self) { self = .array(a) }
        else { self = .object(try c.decode([String: JSONValue].self)) }
    }
    public func encode(to encoder: Encoder) throws {
        var c = encoder.singleValueContainer()
        switch self {
        case .number(let n): try c.encode(n)
        case .string(let s): try c.encode(s)
        case .bool(let b): try c.encode(b)
        case .null: try c.encodeNil()
        case .array(let a): try c.encode(a)
        case .object(let o): try c.encode(o)
        }
    }
    public var description: String {
        switch self {
        case .number(let n): return n == n.rounded() && abs(n) < 1e12 ? String(Int(n)) : String(n)
        case .string(let s): return s
        case .bool(let b): return String(b)
        case .null: return "null"
        case .array(let a): return "[" + a.map(\.description).joined(separator: ", ") + "]"
        case .object(let o): return "{" + o.keys.sorted().map { "\($0): \(o[$0]!)" }.joined(separator: ", ") + "}"
        }
    }
}

/// Where the analysis input came from.
public struct InputDescription: Codable, Sendable {
    public var path: String
    /// `bundle` or `folder`.
    public var kind: String
    public var runId: String?
    public var plan: String?
    public var variant: String?
    public var seed: UInt64?
    public var createdAt: String?
    public var sensor: [String: JSONValue]?
    /// Controller identities by node (bundles from real radios).
    public var controllers: [String: String]?
    /// The plan's radio settings.
    public var radio: [String: JSONValue]?
    /// Node groups of an A/B run: each node's group, and each group's sensor settings.
    public var nodeGroups: [String: String]?
    public var groupSensor: [String: [String: JSONValue]]?
    /// Infrastructure faults the manifest records (a node not complete, gaps, dongle
    /// recoveries): a run with any is judged `infra`, never a protocol regression.
    public var infrastructure: [String]?
    /// The radio kind and the set of controllers (the testbed runs are compared within).
    public var testbed: String?
    /// An operator aborted the run (manifest.json): it has no verdict, is in no trend and no
    /// baseline (issue 40). Absent when it was not.
    public var aborted: Bool?
    /// Each node's device across runs (lab runs): "dongle <address>", "dongle <label>" or
    /// "agent <name>", from the manifest; compare draws a dongle once for all of its runs.
    public var units: [String: String]?
}

public enum AnalysisError: Error, CustomStringConvertible {
    case notFound(String)
    case noDevices(String)
    case missingWindow(String)
    case badFlag(String)
    case badManifest(String)
    case tooManyDevices(String, Int)
    public var description: String {
        switch self {
        case .notFound(let p): return "\(p): no such folder"
        case .noDevices(let p): return "\(p): no device folders found (a bundle has nodes/<node>/, a plain test folder has one folder per device)"
        case .missingWindow(let what): return "no contact-event window: \(what)"
        case .badFlag(let what): return what
        case .badManifest(let what): return "manifest.json: \(what)"
        case .tooManyDevices(let p, let n): return "\(p): \(n) device folders; at most \(InputLimits.maximumDevices) can be analysed together"
        }
    }
}

/// Finds the devices and windows of a bundle or a folder of device folders.
enum InputLoader {
    /// A decoding error as a person reads it: the field's path and what is wrong there.
    static func decodingProblem(_ error: Error) -> String {
        func path(_ c: DecodingError.Context) -> String {
            let p = c.codingPath.map { $0.intValue.map { "[\($0)]" } ?? ".\($0.stringValue)" }.joined()
            return p.isEmpty ? "" : "\(p.hasPrefix(".") ? String(p.dropFirst()) : p): "
        }
        switch error as? DecodingError {
        case .typeMismatch(_, let c)?, .valueNotFound(_, let c)?, .dataCorrupted(let c)?: return "\(path(c))\(c.debugDescription)"
        case .keyNotFound(let key, let c)?: return "\(path(c))required field \(key.stringValue) is missing"
        default: return "\(error)"
        }
    }

    static func load(_ path: URL, options: AnalysisOptions) throws -> (InputDescription, [DeviceInput], AnalysisOptions, BundleManifest?) {
        let fm = FileManager.default
        var isDir: ObjCBool = false
        guard fm.fileExists(atPath: path.path, isDirectory: &isDir), isDir.boolValue else { throw AnalysisError.notFound(path.path) }
        var opts = options
        var manifest: BundleManifest?
        let manifestURL = path.appendingPathComponent("manifest.json")
        var devicesRoot = path
        var description = InputDescription(path: path.path, kind: "folder")
        var lst = stat()
        if lstat(manifestURL.path, &lst) == 0 {
            description.kind = "bundle"
            devicesRoot = path.appendingPathComponent("nodes")
            let data: Data
            do { data = try LogFileAccess.read(manifestURL, root: path, limit: InputLimits.maximumJSONBytes) } catch {
                throw AnalysisError.badManifest("\(error)")
            }
            // A manifest that does not decode is an error, never a bundle analysed without its
            // offsets, windows and thresholds.
            let decoded: BundleManifest
            do { decoded = try JSONDecoder().decode(BundleManifest.self, from: data) } catch {
                throw AnalysisError.badManifest("does not decode: \(Self.decodingProblem(error))")
            }
            do {
                let m = decoded
                try check(m)
                manifest = m
                description.runId = m.runId
                description.plan = m.plan?.name
                description.variant = m.plan?.variant
                description.seed = m.seed
                description.createdAt = m.createdAt
                description.sensor = m.plan?.sensor
                description.radio = m.plan?.radio
                var groups = [String: String](), groupSensor = [String: [String: JSONValue]]()
                for n in m.plan?.nodes ?? [] {
                    guard let g = n.group else { continue }
                    groups[n.name] = g
                    if let s = n.sensor { groupSensor[g] = s }
                }
                if !groups.isEmpty { description.nodeGroups = groups; description.groupSensor = groupSensor }
                var controllers = [String: String]()
                for n in m.nodes ?? [] { if let c = n.controller { controllers[n.name] = c.keys.sorted().map { "\($0)=\(c[$0]!)" }.joined(separator: " ") } }
                if !controllers.isEmpty { description.controllers = controllers }
                var units = [String: String]()
                for n in m.nodes ?? [] { if let u = n.unit { units[n.name] = u } }
                if !units.isEmpty { description.units = units }
                var infra = [String]()
                let plannedOff = Set((m.plan?.nodes ?? []).filter(\.offForGood).map(\.name))
                for n in m.nodes ?? [] {
                    let name = String(n.name.prefix(64))
                    let planned = n.state == .partial && plannedOff.contains(n.name) && n.message == nil && n.gaps == nil
                    if let st = n.state, st != .complete, !planned { infra.append("node \(name): state \(st)\(n.message?.text.map { " (\(String($0.prefix(160))))" } ?? "")") }
                    if case .array(let g)? = n.gaps, !g.isEmpty {
                        let reasons = Set(g.compactMap { gap -> String? in
                            guard case .object(let o) = gap else { return nil }
                            return o["reason"]?.text.map { String($0.prefix(80)) }
                        })
                        infra.append("node \(name): \(g.count) gap\(g.count == 1 ? "" : "s") (\(reasons.sorted().joined(separator: ", ")))")
                    }
                    if let r = n.recoveries, !r.isEmpty { infra.append("node \(name): \(r.count) dongle recover\(r.count == 1 ? "y" : "ies")") }
                }
                if m.aborted == true {
                    description.aborted = true
                    infra.insert("the run was aborted", at: 0)
                }
                if !infra.isEmpty { description.infrastructure = infra }
                let radioKind: String
                if case .string(let k)? = m.plan?.radio?["kind"] { radioKind = k } else { radioKind = "sim" }
                description.testbed = radioKind + (controllers.isEmpty ? "" : " · " + Set(controllers.values).sorted().joined(separator: "; "))
                if let ce = m.contactEvent {
                    guard let start = LogTime.parse(text: ce.start) else { throw AnalysisError.badManifest("contactEvent.start \"\(ce.start.prefix(64))\" is not a time (YYYY-MM-DD HH:MM:SS, years 1970 to 9999)") }
                    guard let end = LogTime.parse(text: ce.end) else { throw AnalysisError.badManifest("contactEvent.end \"\(ce.end.prefix(64))\" is not a time (YYYY-MM-DD HH:MM:SS, years 1970 to 9999)") }
                    if opts.ceStart == nil { opts.ceStart = start }
                    if opts.ceEnd == nil { opts.ceEnd = end }
                    if opts.filterStart == nil { opts.filterStart = max(InputLimits.earliestTime, start - (m.plan?.warmup ?? 0)) }
                    if opts.filterEnd == nil { opts.filterEnd = end }
                }
                if opts.thresholds == nil { opts.thresholds = m.plan?.thresholds }
            }
        }
        guard let entries = try? fm.contentsOfDirectory(at: devicesRoot, includingPropertiesForKeys: [.isDirectoryKey]) else {
            throw AnalysisError.noDevices(path.path)
        }
        // A folder that is a link counts (and is flagged if its files lead outside the analysed folder).
        let folders = entries.filter { url in
            var isDir: ObjCBool = false
            return !url.lastPathComponent.hasPrefix(".") && fm.fileExists(atPath: url.path, isDirectory: &isDir) && isDir.boolValue
        }
            .sorted { $0.lastPathComponent < $1.lastPathComponent }
        guard !folders.isEmpty else { throw AnalysisError.noDevices(path.path) }
        guard folders.count + (manifest?.nodes?.count ?? 0) <= 2 * InputLimits.maximumDevices, folders.count <= InputLimits.maximumDevices else {
            throw AnalysisError.tooManyDevices(path.path, max(folders.count, manifest?.nodes?.count ?? 0))
        }
        for (key, value) in opts.timeshifts.sorted(by: { $0.key < $1.key }) {
            if let problem = InputLimits.shiftProblem(value) { throw AnalysisError.badFlag("--timeshift \(key)=\(value): \(problem)") }
        }
        var devices = [DeviceInput]()
        for url in folders {
            let name = url.lastPathComponent
            let node = manifest?.nodes?.first { $0.name == name }
            var device = DeviceInput(folder: name, url: url, model: name, os: node?.os ?? "", osVersion: node?.osVersion ?? "",
                                     shortName: node?.shortName ?? "", shift: 0 - (node?.clockOffset ?? 0), problems: [], root: path)
            // A node the plan switches off for good ends partial: the test's condition, no fault.
            let plannedOff = node?.state == .partial && node?.message == nil && node?.gaps == nil
                && manifest?.plan?.nodes?.first(where: { $0.name == name })?.offForGood == true
            if let state = node?.state, state != .complete, !plannedOff { device.problems.append("node state is \(state) in the manifest") }
            readDetection(&device)
            if let s = opts.timeshifts[name] ?? opts.timeshifts[device.shortName] { device.shift += s }
            devices.append(device)
        }
        if let m = manifest {
            for n in m.nodes ?? [] where !devices.contains(where: { $0.folder == n.name }) {
                devices.append(DeviceInput(folder: n.name, url: devicesRoot.appendingPathComponent(n.name), model: n.name, os: n.os ?? "", osVersion: n.osVersion ?? "",
                                           shortName: n.shortName ?? "", shift: 0, problems: ["node folder missing from the bundle (state \(n.state?.rawValue ?? "unknown"))"], root: path))
            }
            devices.sort { $0.folder < $1.folder }
        }
        let known = Set(devices.map(\.folder) + devices.map(\.shortName))
        for key in opts.timeshifts.keys where !known.contains(key) {
            throw AnalysisError.badFlag("--timeshift \(key)=...: no device folder or shortName \"\(key)\" (devices: \(devices.map(\.folder).joined(separator: ", ")))")
        }
        guard devices.count <= InputLimits.maximumDevices else { throw AnalysisError.tooManyDevices(path.path, devices.count) }
        return (description, devices, opts, manifest)
    }

    /// Every number of a manifest is range-checked before use; names must be plain folder names.
    static func check(_ m: BundleManifest) throws {
        for (i, n) in (m.nodes ?? []).enumerated() {
            if n.name.isEmpty || n.name == "." || n.name == ".." || n.name.contains("/") || n.name.utf8.count > 255 {
                throw AnalysisError.badManifest("nodes[\(i)].name \"\(n.name.prefix(64))\" is not a folder name")
            }
            if let o = n.clockOffset, let problem = InputLimits.shiftProblem(o) { throw AnalysisError.badManifest("nodes[\(i)].clockOffset \(problem)") }
        }
        if let p = m.plan {
            if let w = p.warmup, !(w.isFinite && w >= 0 && w <= InputLimits.maximumShift) { throw AnalysisError.badManifest("plan.warmup \(w) is out of range (0 to \(Int(InputLimits.maximumShift)) s)") }
            if let d = p.duration, !(d.isFinite && d >= 0 && d <= InputLimits.maximumShift) { throw AnalysisError.badManifest("plan.duration \(d) is out of range (0 to \(Int(InputLimits.maximumShift)) s)") }
            if let t = p.thresholds {
                let pcts: [(String, Double)] = [("detectionPct", t.detectionPct), ("continuityPct", t.continuityPct), ("pairContinuityPct", t.pairContinuityPct), ("regressionTolerancePct", t.regressionTolerancePct)]
                for (name, v) in pcts where !(v.isFinite && v >= 0 && v <= 100) { throw AnalysisError.badManifest("plan.thresholds.\(name) \(v) is out of range (0 to 100)") }
                let times: [(String, Double)] = [("timeToFirstDetection", t.timeToFirstDetection), ("timeToFirstRead", t.timeToFirstRead)]
                for (name, v) in times where !(v.isFinite && v >= 0 && v <= InputLimits.maximumShift) { throw AnalysisError.badManifest("plan.thresholds.\(name) \(v) is out of range (0 to \(Int(InputLimits.maximumShift)) s)") }
            }
        }
    }

    /// detection.csv: `<name>,<OS>,<OSVersion>,<ownShortName>,...`.
    static func readDetection(_ device: inout DeviceInput) {
        let url = device.url.appendingPathComponent("detection.csv")
        var fields: [String]?
        do {
            try CSVScanner.scan(url: url, root: device.root) { p, line, _ in
                if fields == nil { fields = (0..<line.count).map { p.string(line.starts[$0], line.ends[$0]) } }
                return true
            }
        } catch let problem as LogFileAccess.Problem {
            device.problems.append(problem.description)
            return
        } catch {
            device.problems.append("detection.csv cannot be read: \(error.localizedDescription)")
            return
        }
        guard let f = fields, f.count >= 4 else {
            device.problems.append(fields == nil ? "detection.csv is empty" : "detection.csv is truncated: \(fields!.count) fields, 4 needed")
            return
        }
        device.model = f[0]
        device.os = f[1]
        device.osVersion = f[2]
        if device.shortName.isEmpty { device.shortName = f[3] }
        else if device.shortName != f[3] { device.problems.append("detection.csv names shortName \(f[3]) but the manifest says \(device.shortName)") }
    }
}
