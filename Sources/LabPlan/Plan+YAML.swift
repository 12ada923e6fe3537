import Foundation
import HeraldCore
import Yams
#if canImport(Glibc)
import Glibc
#endif

/// Upper bounds on everything a plan may say (documented in plans/README.md).
public enum PlanLimits {
    /// A plan file's size.
    public static let maximumFileBytes = 1 << 20
    /// YAML nodes once aliases are expanded.
    public static let maximumYAMLNodes = 100_000
    /// `duration`, and every other duration unless a field says less (7 days).
    public static let maximumDuration: TimeInterval = 7 * 86400
    /// `duration` at least (1 ms), in plan check and simulate alike.
    public static let minimumDuration: TimeInterval = 0.001
    /// Scan phases (`scan.on`, `scan.rest`, `scan.off`).
    public static let maximumScanPhase: TimeInterval = 3600
    /// `scan.on` at least (a shorter scan cycle would flood the scheduler).
    public static let minimumScanOn: TimeInterval = 0.1
    public static let maximumConnectionTimeout: TimeInterval = 600
    public static let maximumConnectLatency: TimeInterval = 60
    /// `radio.crowding`: scan window and interval (the BLE range, 2.5 ms to 10.24 s), capture
    /// threshold in dB, reports per second, connections per controller.
    public static let scanTiming: ClosedRange<TimeInterval> = 0.0025...10.24
    public static let maximumCapture: Double = 40
    public static let maximumReportRate: Double = 100_000
    public static let maximumConnectionLimit = 64
    /// Positions: |x|, |y| at most this many metres; grid spacing at most `maximumSpacing`.
    public static let maximumCoordinate: Double = 10_000
    public static let maximumSpacing: Double = 1_000
    public static let maximumNodes = 1000
    public static let maximumPowerIntervals = 1000
    public static let maximumTags = 64
    public static let maximumTextBytes = 65_536
    public static let maximumLabelBytes = 256
    /// `start`: years 1970 to 2999.
    public static let latestStart = Date(timeIntervalSince1970: 32_503_680_000) // 3000-01-01

    /// Counts the expanded tree without recursion, stopping at the bound.
    static func sizeProblem(_ root: Node) -> String? {
        var stack = [root]
        var count = 0
        while let node = stack.popLast() {
            count += 1
            if count > maximumYAMLNodes {
                return "the document has more than \(maximumYAMLNodes) YAML nodes once aliases are expanded (an alias bomb?); a plan needs far fewer"
            }
            switch node {
            case .scalar, .alias: break
            case .sequence(let seq): stack.append(contentsOf: seq)
            case .mapping(let m): for (k, v) in m { stack.append(k); stack.append(v) }
            }
        }
        return nil
    }
}

/// A plan that could not be read: every problem, each with its field path.
public struct PlanError: Error, CustomStringConvertible, Sendable {
    public struct Problem: Sendable, Equatable, CustomStringConvertible {
        /// Field path such as `sensor.scan.on` or `nodes[3].name`; empty for the whole document.
        public var path: String
        public var message: String
        /// 1-based line in the file, when known.
        public var line: Int?
        public var description: String {
            let at = path.isEmpty ? "" : "\(path): "
            let ln = line.map { " (line \($0))" } ?? ""
            return "\(at)\(message)\(ln)"
        }
    }
    public var source: String
    public var problems: [Problem]
    public var description: String {
        problems.map { "\(source): \($0)" }.joined(separator: "\n")
    }
}

extension Plan {
    /// Reads and validates a plan file.
    public static func load(path: String) throws(PlanError) -> Plan {
        try parse(yaml: try readText(path: path), source: path)
    }

    /// A plan file's text: a regular file (not a FIFO, device or directory) of at most
    /// `PlanLimits.maximumFileBytes`, in UTF-8.
    public static func readText(path: String) throws(PlanError) -> String {
        func problem(_ message: String) -> PlanError { PlanError(source: path, problems: [.init(path: "", message: message)]) }
        let fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { throw problem("cannot read the file: \(String(cString: strerror(errno)))") }
        let handle = FileHandle(fileDescriptor: fd, closeOnDealloc: true)
        defer { try? handle.close() }
        var st = stat()
        guard fstat(fd, &st) == 0, st.st_mode & S_IFMT == S_IFREG else {
            throw problem("is not a regular file (a directory, FIFO or device); a plan is a YAML file")
        }
        guard st.st_size <= PlanLimits.maximumFileBytes else {
            throw problem("is \(st.st_size) bytes; a plan is at most \(PlanLimits.maximumFileBytes) bytes")
        }
        var data = Data()
        do {
            while let chunk = try handle.read(upToCount: 1 << 16), !chunk.isEmpty {
                data.append(chunk)
                if data.count > PlanLimits.maximumFileBytes { throw problem("is larger than \(PlanLimits.maximumFileBytes) bytes") }
            }
        } catch let e as PlanError { throw e } catch {
            throw problem("cannot read the file: \(error.localizedDescription)")
        }
        guard let text = String(data: data, encoding: .utf8) else { throw problem("is not UTF-8 text") }
        return text
    }

    /// A duration as plans write it (`500ms`, `30s`, `2m`, `8h`), within `PlanLimits.maximumDuration`.
    public static func parseDuration(_ text: String) -> TimeInterval? {
        var reader = PlanReader()
        let v = reader.duration(Node.scalar(.init(text)), "")
        return reader.problems.isEmpty ? v : nil
    }

    /// A duration as plans write it, from `min` to `max`: the value, or what is wrong with it and
    /// what to write instead (the message command-line flags print).
    public static func duration(_ text: String, min: TimeInterval = 0, max: TimeInterval = PlanLimits.maximumDuration,
                                allowZero: Bool = true) throws(DurationError) -> TimeInterval {
        var reader = PlanReader()
        let v = reader.duration(Node.scalar(.init(text)), "", allowZero: allowZero, min: min, max: max)
        if let problem = reader.problems.first { throw DurationError(message: problem.message) }
        guard let v else { throw DurationError(message: "is not a duration") }
        return v
    }

    public struct DurationError: Error, CustomStringConvertible {
        public let message: String
        public var description: String { message }
    }

    /// Parses and validates plan YAML; `source` names the input in error messages.
    public static func parse(yaml: String, source: String = "plan") throws(PlanError) -> Plan {
        if yaml.utf8.count > PlanLimits.maximumFileBytes {
            throw PlanError(source: source, problems: [.init(path: "", message: "is \(yaml.utf8.count) bytes; a plan is at most \(PlanLimits.maximumFileBytes) bytes")])
        }
        let root: Node?
        do {
            root = try Yams.compose(yaml: yaml)
        } catch {
            // The parser quotes the offending line: keep each line of its message short.
            let message = "\(error)".split(separator: "\n", omittingEmptySubsequences: false)
                .map { (line: Substring) -> String in line.count > 160 ? String(line.prefix(160)) + "…" : String(line) }
                .prefix(6).joined(separator: "\n")
            throw PlanError(source: source, problems: [.init(path: "", message: "not valid YAML: \(message)")])
        }
        guard let root else {
            throw PlanError(source: source, problems: [.init(path: "", message: "the file is empty; a plan needs at least name, duration and nodes")])
        }
        // Aliases share nodes, so a small file can stand for a huge tree ("billion laughs"):
        // count the tree as expanded, up to a bound, before reading it.
        if let problem = PlanLimits.sizeProblem(root) {
            throw PlanError(source: source, problems: [.init(path: "", message: problem)])
        }
        var reader = PlanReader()
        let plan = reader.plan(root)
        if let plan, reader.problems.isEmpty { return plan }
        throw PlanError(source: source, problems: reader.problems.isEmpty
            ? [.init(path: "", message: "invalid plan")] : reader.problems)
    }
}

/// Walks the YAML tree, collecting every problem with its field path.
struct PlanReader {
    var problems: [PlanError.Problem] = []

    mutating func fail(_ path: String, _ node: Node?, _ message: String) {
        problems.append(.init(path: path, message: message, line: node?.mark?.line))
    }

    /// The entries of a mapping whose keys must all be among `known`.
    mutating func mapping(_ node: Node, _ path: String, known: [String]) -> [String: Node]? {
        guard case .mapping(let m) = node else {
            fail(path, node, "expected a mapping with fields \(known.joined(separator: ", "))")
            return nil
        }
        var out = [String: Node]()
        for (k, v) in m {
            guard let key = k.string else { fail(path, k, "field names must be text"); continue }
            let sub = path.isEmpty ? key : "\(path).\(key)"
            if !known.contains(key) {
                let hint = Self.closest(to: key, among: known).map { "did you mean \($0)? " } ?? ""
                fail(sub, k, "unknown field (\(hint)known: \(known.joined(separator: ", ")))")
                continue
            }
            if out[key] != nil { fail(sub, k, "given twice"); continue }
            out[key] = v
        }
        return out
    }

    mutating func string(_ node: Node, _ path: String, maxBytes: Int = PlanLimits.maximumLabelBytes) -> String? {
        guard case .scalar(let s) = node else { fail(path, node, "expected text"); return nil }
        if s.string.utf8.count > maxBytes { fail(path, node, "is \(s.string.utf8.count) bytes long; at most \(maxBytes)"); return nil }
        return s.string
    }

    mutating func name(_ node: Node, _ path: String) -> String? {
        guard let s = string(node, path) else { return nil }
        if let problem = SafeName.problem(with: s) { fail(path, node, "\"\(s)\" \(problem)"); return nil }
        return s
    }

    mutating func number(_ node: Node, _ path: String, in range: ClosedRange<Double>? = nil, what: String = "a number") -> Double? {
        guard case .scalar(let s) = node, let v = Double(s.string.trimmingCharacters(in: .whitespaces)), v.isFinite else {
            fail(path, node, "expected \(what), got \(Self.show(node))")
            return nil
        }
        if let range, !range.contains(v) {
            fail(path, node, "\(Self.format(v)) is out of range; expected \(what) from \(Self.format(range.lowerBound)) to \(Self.format(range.upperBound))")
            return nil
        }
        return v
    }

    mutating func integer(_ node: Node, _ path: String, in range: ClosedRange<Int>) -> Int? {
        guard case .scalar(let s) = node, let v = Int(s.string.trimmingCharacters(in: .whitespaces)) else {
            fail(path, node, "expected a whole number, got \(Self.show(node))")
            return nil
        }
        if !range.contains(v) { fail(path, node, "\(v) is out of range; expected \(range.lowerBound) to \(range.upperBound)"); return nil }
        return v
    }

    mutating func bool(_ node: Node, _ path: String) -> Bool? {
        guard case .scalar(let s) = node else { fail(path, node, "expected true or false"); return nil }
        switch s.string.lowercased() {
        case "true", "yes", "on": return true
        case "false", "no", "off": return false
        default: fail(path, node, "expected true or false, got \(Self.show(node))"); return nil
        }
    }

    /// `500ms`, `4s`, `1.5s`, `30m`, `8h`. Bare numbers are refused.
    mutating func duration(_ node: Node, _ path: String, allowZero: Bool = true, min: TimeInterval = 0,
                           max: TimeInterval = PlanLimits.maximumDuration) -> TimeInterval? {
        guard case .scalar(let s) = node else { fail(path, node, "expected a duration such as 4s, 500ms, 2m or 1h"); return nil }
        let text = s.string.trimmingCharacters(in: .whitespaces)
        let units = Self.durationUnits
        for (suffix, scale) in units where text.hasSuffix(suffix) {
            let number = String(text.dropLast(suffix.count)).trimmingCharacters(in: .whitespaces)
            // "4ms" also ends in "s": only accept the longest matching unit.
            if suffix == "s", number.hasSuffix("m") { continue }
            if number.hasPrefix("-"), let v = Double(number), v < 0 { fail(path, node, "negative duration \"\(text.prefix(64))\""); return nil }
            // One rule for every reader of durations (plan check, simulate, flags): a number
            // starts with a digit and is decimal ("+.5ms", ".5s", "0x10s", "inf s" are not
            // durations), so nothing Double's own syntax allows slips through.
            guard let v = Self.decimal(number) else { break }
            let seconds = v * scale
            if !seconds.isFinite || seconds > max {
                fail(path, node, "\"\(text.prefix(64))\" is too long; at most \(Self.formatSeconds(max))"); return nil
            }
            if v == 0 && !allowZero { fail(path, node, "must be longer than 0"); return nil }
            if seconds < min && (v != 0 || !allowZero) { fail(path, node, "\"\(text.prefix(64))\" is too short; at least \(Self.formatSeconds(min))"); return nil }
            return seconds
        }
        let shown = String(text.prefix(64))
        if let v = Self.decimal(text), v.isFinite {
            // Suggest the unit that puts the number in range: `advertInterval: 100` means 100ms.
            let preferred = ["s", "ms", "m", "h", "d"].compactMap { u in Self.durationUnits.first { $0.0 == u } }
            let fits = preferred.first { _, scale in v * scale <= max && v * scale >= min && (v > 0 || allowZero) }
            if let (unit, _) = fits {
                fail(path, node, "\"\(shown)\" has no unit; write a duration with one, such as \(shown)\(unit) (units ms, s, m, h, d)")
            } else {
                fail(path, node, "\"\(shown)\" has no unit, and no unit puts it between \(Self.formatSeconds(min)) and \(Self.formatSeconds(max)); write a duration such as \(Self.formatSeconds(Swift.max(min, Swift.min(max, 1))))")
            }
        } else {
            fail(path, node, "\"\(shown)\" is not a duration; write one such as 4s, 500ms, 2m or 1h (units ms, s, m, h, d)")
        }
        return nil
    }

    /// A plain decimal number: a digit first, then digits, one `.` and an exponent at most
    /// (`0.5`, `12`, `1e3`); no sign, no hexadecimal, no `inf` or `nan`.
    static func decimal(_ text: String) -> Double? {
        guard let first = text.utf8.first, first >= 0x30 && first <= 0x39,
              text.utf8.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: "e") || $0 == UInt8(ascii: "E") || $0 == UInt8(ascii: "+") || $0 == UInt8(ascii: "-") }),
              text.utf8.filter({ $0 == UInt8(ascii: ".") }).count <= 1 else { return nil }
        return Double(text)
    }

    /// The units a duration may carry, longest suffix first where one ends another ("ms", "s").
    static let durationUnits: [(String, Double)] = [("ms", 0.001), ("s", 1), ("m", 60), ("h", 3600), ("d", 86400)]

    /// The known name closest to `word` (a typo of one or two letters, or another case), if any.
    static func closest(to word: String, among known: [String]) -> String? {
        let w = Array(word.lowercased())
        guard w.count <= 64 else { return nil }
        func distance(_ b: [Character]) -> Int {
            var row = Array(0...b.count)
            for (i, a) in w.enumerated() {
                var previous = row[0]
                row[0] = i + 1
                for (j, c) in b.enumerated() {
                    let next = Swift.min(row[j + 1] + 1, row[j] + 1, previous + (a == c ? 0 : 1))
                    previous = row[j + 1]
                    row[j + 1] = next
                }
            }
            return row[b.count]
        }
        let scored = known.map { ($0, distance(Array($0.lowercased()))) }.min { $0.1 < $1.1 }
        guard let (best, d) = scored, d <= Swift.max(1, Swift.min(2, best.count / 3)) else { return nil }
        return best
    }

    /// Metres: a number, or text with `m` or `cm`; finite and at most `max` in magnitude.
    mutating func distance(_ node: Node, _ path: String, max: Double = PlanLimits.maximumCoordinate) -> Double? {
        guard case .scalar(let s) = node else { fail(path, node, "expected a distance in metres such as 2 or 2m"); return nil }
        let text = String(s.string.trimmingCharacters(in: .whitespaces).prefix(64))
        var value: Double?
        if let v = Double(text) { value = v }
        else if text.hasSuffix("cm"), let v = Double(text.dropLast(2).trimmingCharacters(in: .whitespaces)) { value = v / 100 }
        else if text.hasSuffix("mm") { fail(path, node, "\"\(text)\": use m or cm"); return nil }
        else if text.hasSuffix("m"), let v = Double(text.dropLast(1).trimmingCharacters(in: .whitespaces)) { value = v }
        guard let v = value else {
            fail(path, node, "\"\(text)\" is not a distance; write metres such as 2, 2m or 150cm")
            return nil
        }
        guard v.isFinite else { fail(path, node, "\"\(text)\" is not a finite distance"); return nil }
        guard abs(v) <= max else { fail(path, node, "\(Self.format(v)) m is out of range; at most \(Self.format(max)) m from the origin"); return nil }
        return v
    }

    mutating func stringList(_ node: Node, _ path: String, maxCount: Int = PlanLimits.maximumTags) -> [String]? {
        guard case .sequence(let seq) = node else { fail(path, node, "expected a list"); return nil }
        if seq.count > maxCount { fail(path, node, "has \(seq.count) entries; at most \(maxCount)"); return nil }
        var out = [String]()
        for (i, item) in seq.enumerated() { if let s = string(item, "\(path)[\(i)]") { out.append(s) } }
        return out
    }

    static func show(_ node: Node) -> String {
        switch node {
        case .scalar(let s): return "\"\(s.string)\""
        case .mapping: return "a mapping"
        case .sequence: return "a list"
        case .alias: return "an alias"
        }
    }

    static func format(_ v: Double) -> String { v.isFinite && v == v.rounded() && abs(v) < 1e15 ? String(Int(v)) : String(v) }

    static func formatSeconds(_ v: Double) -> String {
        if v >= 86400, v.truncatingRemainder(dividingBy: 86400) == 0 { return "\(Int(v / 86400)) days (\(Int(v / 3600))h)" }
        if v >= 3600, v.truncatingRemainder(dividingBy: 3600) == 0 { return "\(Int(v / 3600))h" }
        if v >= 60, v.truncatingRemainder(dividingBy: 60) == 0 { return "\(Int(v / 60))m" }
        if v >= 1 { return "\(format(v))s" }
        return "\(format(v * 1000))ms"
    }

    // MARK: The plan

    mutating func plan(_ root: Node) -> Plan? {
        guard let m = mapping(root, "", known: ["name", "description", "variant", "duration", "warmup", "start", "seed", "nodes", "sensor", "radio", "thresholds", "agents", "groups", "study", "studyRun"]) else { return nil }
        var name: String?
        if let n = m["name"] { name = self.name(n, "name") } else { fail("name", nil, "required: the plan's name") }
        var duration: TimeInterval?
        if let n = m["duration"] { duration = self.duration(n, "duration", allowZero: false, min: PlanLimits.minimumDuration) } else { fail("duration", nil, "required: how long the test runs, e.g. 30m") }
        var nodes: [NodeSpec]?
        if let n = m["nodes"] { nodes = self.nodes(n, "nodes") } else { fail("nodes", nil, "required: a list of nodes, or count and grid") }

        var plan = Plan(name: name ?? "", duration: duration ?? 1, nodes: nodes ?? [])
        if let n = m["description"], let s = string(n, "description", maxBytes: PlanLimits.maximumTextBytes) { plan.description = s }
        if let n = m["variant"], let s = string(n, "variant") { plan.variant = s }
        if let n = m["warmup"], let w = self.duration(n, "warmup") {
            if let duration, w >= duration { fail("warmup", n, "must be shorter than duration") } else { plan.warmup = w }
        }
        if let n = m["start"], let s = string(n, "start") {
            if let d = HeraldTimestamp.parse(s) {
                if d.timeIntervalSince1970 >= 0, d < PlanLimits.latestStart { plan.start = d } else { fail("start", n, "\"\(s)\" is out of range; years 1970 to 2999") }
            } else { fail("start", n, "\"\(s)\" is not a time; write 2026-01-01T00:00:00Z") }
        }
        if let n = m["seed"], let v = integer(n, "seed", in: 0...Int.max) { plan.seed = UInt64(v) }
        if let n = m["sensor"], let s = sensor(n, "sensor") { plan.sensor = s }
        if let n = m["radio"], let r = radio(n, "radio") { plan.radio = r }
        if let n = m["thresholds"], let t = thresholds(n, "thresholds") { plan.thresholds = t }
        if let n = m["agents"], let a = agents(n, "agents", nodeCount: plan.nodes.count, radio: plan.radio.kind) { plan.agents = a }
        if let n = m["groups"], let g = groups(n, "groups", root: root, nodes: &plan.nodes) { plan.groups = g }
        if let n = m["study"], let s = study(n, "study", planName: plan.name) { plan.study = s }
        if let n = m["studyRun"] {
            if m["study"] != nil { fail("studyRun", n, "a run of a study is not itself a study; give study or studyRun, not both") } else if let t = studyRun(n, "studyRun", planName: plan.name) { plan.studyRun = t }
        }
        if plan.radio.kind != .sim {
            for (i, node) in plan.nodes.enumerated() {
                if let p = node.persona { fail("nodes[\(i)].persona", nil, Self.personaNeedsSim(p)) }
            }
        }
        if let duration {
            for (i, node) in plan.nodes.enumerated() {
                for (j, p) in node.power.enumerated() where p.off >= duration {
                    fail("nodes[\(i)].power[\(j)].off", nil, "is at or after the end of the run (\(Self.format(duration))s)")
                }
            }
        }
        return problems.isEmpty ? plan : nil
    }

    mutating func nodes(_ node: Node, _ path: String) -> [NodeSpec]? {
        var specs = [NodeSpec]()
        switch node {
        case .sequence(let seq):
            if seq.count < 2 { fail(path, node, "needs at least 2 nodes: a proximity test of one node detects nothing"); return nil }
            if seq.count > PlanLimits.maximumNodes { fail(path, node, "has \(seq.count) nodes; at most \(PlanLimits.maximumNodes)"); return nil }
            for (i, item) in seq.enumerated() {
                if let spec = nodeSpec(item, "\(path)[\(i)]", index: i) { specs.append(spec) }
            }
        case .mapping:
            guard let m = mapping(node, path, known: ["count", "prefix", "grid", "identifiers"]) else { return nil }
            guard let countNode = m["count"] else { fail("\(path).count", node, "required with a grid: how many nodes"); return nil }
            guard let count = integer(countNode, "\(path).count", in: 2...PlanLimits.maximumNodes) else { return nil }
            var prefix = "node"
            if let p = m["prefix"], let s = name(p, "\(path).prefix") { prefix = s }
            var columns = max(1, Int(Double(count).squareRoot().rounded(.up)))
            var spacing = 2.0
            if let g = m["grid"], let gm = mapping(g, "\(path).grid", known: ["columns", "spacing"]) {
                if let c = gm["columns"], let v = integer(c, "\(path).grid.columns", in: 1...1000) { columns = v }
                if let s = gm["spacing"], let v = distance(s, "\(path).grid.spacing", max: PlanLimits.maximumSpacing) {
                    if v <= 0 { fail("\(path).grid.spacing", s, "must be more than 0 m") } else { spacing = v }
                }
            }
            let extent = Double(max(columns, (count + columns - 1) / columns)) * spacing
            if extent > PlanLimits.maximumCoordinate {
                fail("\(path).grid", m["grid"], "spans \(Self.format(extent)) m; positions must stay within \(Self.format(PlanLimits.maximumCoordinate)) m of the origin")
                return nil
            }
            var pinned = [Int32?](repeating: nil, count: count)
            if let ids = m["identifiers"] {
                if case .sequence(let seq) = ids, seq.count == count {
                    for (i, item) in seq.enumerated() {
                        if let v = integer(item, "\(path).identifiers[\(i)]", in: Int(Int32.min)...Int(Int32.max)) { pinned[i] = Int32(v) }
                    }
                } else {
                    fail("\(path).identifiers", ids, "expected a list of \(count) identifiers, one per node")
                }
            }
            for i in 0..<count {
                specs.append(NodeSpec(name: "\(prefix)\(i + 1)", identifier: pinned[i],
                                      position: Position(x: Double(i % columns) * spacing, y: Double(i / columns) * spacing)))
            }
        default:
            fail(path, node, "expected a list of nodes, or a mapping with count, prefix and grid")
            return nil
        }
        var seenNames = [String: Int]()
        var seenShort = [String: Int]()
        for (i, s) in specs.enumerated() {
            if let j = seenNames[s.name] { fail("\(path)[\(i)].name", nil, "duplicate node name \"\(s.name)\" (also \(path)[\(j)])"); continue }
            seenNames[s.name] = i
            if let j = seenShort[s.shortName] {
                fail("\(path)[\(i)].identifier", nil, "gives shortName \"\(s.shortName)\", the same as \(path)[\(j)] (\(specs[j].name)); logs could not tell them apart")
            } else { seenShort[s.shortName] = i }
        }
        return specs
    }

    mutating func nodeSpec(_ node: Node, _ path: String, index: Int) -> NodeSpec? {
        if case .scalar = node {
            guard let n = name(node, path) else { return nil }
            return NodeSpec(name: n, position: Position(x: Double(index), y: 0))
        }
        guard let m = mapping(node, path, known: ["name", "position", "identifier", "tags", "power", "persona", "location"]) else { return nil }
        guard let nameNode = m["name"] else { fail("\(path).name", node, "required"); return nil }
        guard let name = self.name(nameNode, "\(path).name") else { return nil }
        var position = Position(x: Double(index), y: 0)
        if let p = m["position"] {
            if case .sequence(let seq) = p, seq.count == 2 {
                let x = distance(seq[0], "\(path).position[0]"), y = distance(seq[1], "\(path).position[1]")
                if let x, let y { position = Position(x: x, y: y) }
            } else {
                fail("\(path).position", p, "expected [x, y] in metres")
            }
        }
        var identifier: Int32?
        if let n = m["identifier"], let v = integer(n, "\(path).identifier", in: Int(Int32.min)...Int(Int32.max)) { identifier = Int32(v) }
        var tags = [String]()
        if let t = m["tags"], let list = stringList(t, "\(path).tags") { tags = list }
        var power = [PowerInterval]()
        if let p = m["power"] {
            if case .sequence(let seq) = p, seq.count > PlanLimits.maximumPowerIntervals {
                fail("\(path).power", p, "has \(seq.count) intervals; at most \(PlanLimits.maximumPowerIntervals)")
            } else if case .sequence(let seq) = p {
                for (j, item) in seq.enumerated() {
                    let ip = "\(path).power[\(j)]"
                    guard let pm = mapping(item, ip, known: ["off", "on"]) else { continue }
                    guard let offNode = pm["off"], let off = duration(offNode, "\(ip).off") else {
                        if pm["off"] == nil { fail("\(ip).off", item, "required: when the node powers off") }
                        continue
                    }
                    var on: TimeInterval?
                    if let onNode = pm["on"], let v = duration(onNode, "\(ip).on") {
                        if v <= off { fail("\(ip).on", onNode, "must be after off") } else { on = v }
                    }
                    power.append(PowerInterval(off: off, on: on))
                }
            } else { fail("\(path).power", p, "expected a list of {off, on} intervals") }
        }
        var persona: Persona?
        if let n = m["persona"], let v = string(n, "\(path).persona") {
            if let p = Persona(rawValue: v) { persona = p }
            else if v != "linux" {
                fail("\(path).persona", n, "\"\(v.prefix(64))\" is not a persona; use \(Persona.allCases.map(\.rawValue).joined(separator: ", ")), or linux (the default: a Linux node)")
            }
        }
        var spec = NodeSpec(name: name, identifier: identifier, position: position, tags: tags, power: power, persona: persona)
        if let n = m["location"], let v = bool(n, "\(path).location") {
            if persona == .iosBackground || persona == .iosForeground { spec.location = v }
            else { fail("\(path).location", n, "only an iPhone persona (ios-background, ios-foreground) has a location permission to switch") }
        }
        return spec
    }

    static func personaNeedsSim(_ p: Persona) -> String {
        "\(p.rawValue) is a simulated phone: personas need radio kind sim (a lab drives Linux nodes only)"
    }

    mutating func sensor(_ node: Node, _ path: String) -> SensorSettings? {
        guard let m = mapping(node, path, known: ["scan", "advertInterval", "txPower", "includeTxPower", "pseudoAddress", "connectionTimeout", "payloadSharing", "logLevel", "purgeAfter"]) else { return nil }
        var s = SensorSettings()
        if let n = m["scan"], let sm = mapping(n, "\(path).scan", known: ["on", "rest", "off"]) {
            if let v = sm["on"], let d = duration(v, "\(path).scan.on", allowZero: false, min: PlanLimits.minimumScanOn, max: PlanLimits.maximumScanPhase) { s.scanOn = d }
            if let v = sm["rest"], let d = duration(v, "\(path).scan.rest", max: PlanLimits.maximumScanPhase) { s.scanRest = d }
            if let v = sm["off"], let d = duration(v, "\(path).scan.off", max: PlanLimits.maximumScanPhase) { s.scanOff = d }
        }
        // BLE advertising intervals run from 20ms to 10.24s.
        if let n = m["advertInterval"], let d = duration(n, "\(path).advertInterval", allowZero: false, min: 0.02, max: 10.24) { s.advertInterval = d }
        if let n = m["txPower"], let v = integer(n, "\(path).txPower", in: -127...20) { s.txPower = v }
        if let n = m["includeTxPower"], let v = bool(n, "\(path).includeTxPower") { s.includeTxPower = v }
        if let n = m["pseudoAddress"], let v = bool(n, "\(path).pseudoAddress") { s.pseudoAddress = v }
        if let n = m["connectionTimeout"], let d = duration(n, "\(path).connectionTimeout", allowZero: false, min: 0.01, max: PlanLimits.maximumConnectionTimeout) { s.connectionTimeout = d }
        if let n = m["payloadSharing"], let v = bool(n, "\(path).payloadSharing") { s.payloadSharing = v }
        if let n = m["logLevel"], let v = string(n, "\(path).logLevel") {
            if let l = LogLevelSetting(rawValue: v) { s.logLevel = l } else { fail("\(path).logLevel", n, "\"\(v)\" is not a level; use debug, info or fault") }
        }
        if let n = m["purgeAfter"], let d = duration(n, "\(path).purgeAfter", allowZero: false, min: 1) { s.purgeAfter = d }
        return s
    }

    mutating func radio(_ node: Node, _ path: String) -> RadioSettings? {
        guard let m = mapping(node, path, known: ["kind", "adapter", "referencePower", "pathLossExponent", "shadowing", "sensitivity", "reportLoss", "connectSuccess", "connectLatency", "macRotation", "crowding", "devices", "environment", "phones"]) else { return nil }
        var r = RadioSettings()
        if let n = m["kind"], let v = string(n, "\(path).kind") {
            if let k = RadioKind(rawValue: v) { r.kind = k } else { fail("\(path).kind", n, "\"\(v)\" is not a radio; use sim or bluez") }
        }
        if let n = m["adapter"], let v = string(n, "\(path).adapter", maxBytes: 64) { r.adapter = v }
        if let n = m["referencePower"], let v = number(n, "\(path).referencePower", in: -120...0, what: "dBm") { r.referencePower = v }
        if let n = m["pathLossExponent"], let v = number(n, "\(path).pathLossExponent", in: 1...6) { r.pathLossExponent = v }
        if let n = m["shadowing"], let v = number(n, "\(path).shadowing", in: 0...30, what: "dB") { r.shadowing = v }
        if let n = m["sensitivity"], let v = number(n, "\(path).sensitivity", in: -130...0, what: "dBm") { r.sensitivity = v }
        if let n = m["reportLoss"], let v = number(n, "\(path).reportLoss", in: 0...1, what: "a probability") { r.reportLoss = v }
        if let n = m["connectSuccess"], let v = number(n, "\(path).connectSuccess", in: 0...1, what: "a probability") { r.connectSuccess = v }
        if let n = m["connectLatency"], let d = duration(n, "\(path).connectLatency", max: PlanLimits.maximumConnectLatency) { r.connectLatency = d }
        if let n = m["macRotation"], let d = duration(n, "\(path).macRotation") {
            if d > 0 && d < 1 { fail("\(path).macRotation", n, "rotating more often than every 1s is not realistic") } else { r.macRotation = d }
        }
        if let n = m["crowding"] { r.crowding = crowding(n, "\(path).crowding") }
        if let n = m["devices"] { r.devices = devices(n, "\(path).devices") }
        if let n = m["environment"] { r.environment = environment(n, "\(path).environment") }
        if let n = m["phones"] { r.phones = phones(n, "\(path).phones") }
        return r
    }

    /// `devices: on` (the documented spreads), `off` (identical devices), or a mapping that
    /// starts from the documented spreads and sets each (`txSpread: 2dB`, `clockDrift: 40ppm`).
    mutating func devices(_ node: Node, _ path: String) -> DeviceVariation? {
        if case .scalar = node {
            guard let on = bool(node, path) else { return nil }
            return on ? DeviceVariation() : nil
        }
        let fields = DeviceVariation.limits.map(\.field)
        guard let m = mapping(node, path, known: fields + ["population"]) else { return nil }
        var d = DeviceVariation()
        for f in DeviceVariation.limits {
            if let n = m[f.field], let v = measure(n, "\(path).\(f.field)", in: f.range, unit: f.unit) { d.set(f.field, v) }
        }
        if let n = m["population"], let v = integer(n, "\(path).population", in: 0...1_000_000_000) { d.population = UInt64(v) }
        return d
    }

    /// `environment: on`, `off`, or a mapping of its parts (`fieldTime` and `burstLength` are durations).
    mutating func environment(_ node: Node, _ path: String) -> RunEnvironment? {
        parts(node, path, RunEnvironment(), limits: RunEnvironment.limits) { $0.set($1, $2) }
    }

    /// `phones: on`, `off`, or a mapping of its parts (`androidStallLength`, `iosAwake` ... are durations).
    mutating func phones(_ node: Node, _ path: String) -> PhoneBehaviour? {
        guard let b = parts(node, path, PhoneBehaviour(), limits: PhoneBehaviour.limits, set: { $0.set($1, $2) }) else { return nil }
        for f in ["androidRotation", "iosRotation"] where b.value(f) > 0 && b.value(f) < 1 {
            fail("\(path).\(f)", nil, "rotating more often than every 1s is not realistic")
        }
        return b
    }

    /// `on` (the defaults), `off` (nil), or a mapping that starts from the defaults and sets
    /// fields: a unit `s` is a duration (0 allowed only where the range starts at 0), the rest numbers with their unit.
    mutating func parts<T>(_ node: Node, _ path: String, _ defaults: T, limits: [(field: String, range: ClosedRange<Double>, unit: String)],
                           set: (inout T, String, Double) -> Void) -> T? {
        if case .scalar = node {
            guard let on = bool(node, path) else { return nil }
            return on ? defaults : nil
        }
        guard let m = mapping(node, path, known: limits.map(\.field)) else { return nil }
        var t = defaults
        for f in limits {
            guard let n = m[f.field] else { continue }
            if f.unit == "s" {
                if let d = duration(n, "\(path).\(f.field)", allowZero: f.range.lowerBound == 0, min: f.range.lowerBound, max: f.range.upperBound) { set(&t, f.field, d) }
            } else if let v = measure(n, "\(path).\(f.field)", in: f.range, unit: f.unit) {
                set(&t, f.field, v)
            }
        }
        return t
    }

    /// A number with an optional unit (`3dB`, `3 dB`, `20ppm`, `0.05`), range-checked:
    /// `radio.devices.txSpread: 40dB is more than 20dB`.
    mutating func measure(_ node: Node, _ path: String, in range: ClosedRange<Double>, unit: String) -> Double? {
        guard case .scalar(let s) = node else { fail(path, node, "expected a number\(unit.isEmpty ? "" : " of \(unit.trimmingCharacters(in: .whitespaces))"), got \(Self.show(node))"); return nil }
        var text = s.string.trimmingCharacters(in: .whitespaces)
        let shown = String(text.prefix(64))
        let suffix = unit.trimmingCharacters(in: .whitespaces)
        if !suffix.isEmpty, text.lowercased().hasSuffix(suffix.lowercased()) { text = String(text.dropLast(suffix.count)).trimmingCharacters(in: .whitespaces) }
        guard let v = Self.decimal(text) ?? (text.hasPrefix("-") ? Self.decimal(String(text.dropFirst())).map { -$0 } : nil), v.isFinite else {
            fail(path, node, "expected a number\(suffix.isEmpty ? "" : " of \(suffix)"), got \(Self.show(node))")
            return nil
        }
        if v > range.upperBound { fail(path, node, "\(shown) is more than \(Self.format(range.upperBound))\(unit)"); return nil }
        if v < range.lowerBound { fail(path, node, "\(shown) is less than \(Self.format(range.lowerBound))\(unit)"); return nil }
        return v
    }

    /// Whether a scalar says a part is off (`off`, `false`, `no`).
    static func saysOff(_ node: Node) -> Bool {
        guard case .scalar(let s) = node else { return false }
        return ["off", "false", "no"].contains(s.string.lowercased())
    }

    /// `crowding: on` (the calibrated model), `off`, or a mapping that starts from the calibrated
    /// model and sets or switches `off` each part.
    mutating func crowding(_ node: Node, _ path: String) -> CrowdingSettings? {
        if case .scalar = node {
            guard let on = bool(node, path) else { return nil }
            return on ? CrowdingSettings() : nil
        }
        guard let m = mapping(node, path, known: ["collisions", "capture", "scanWindow", "scanInterval", "reportRate", "maxConnections", "discoveryTime", "connectLoad"]) else { return nil }
        var c = CrowdingSettings()
        if let n = m["collisions"], let v = bool(n, "\(path).collisions") { c.collisions = v }
        if let n = m["capture"] {
            if Self.saysOff(n) { c.capture = nil } else if let v = number(n, "\(path).capture", in: 0...PlanLimits.maximumCapture, what: "dB (or off)") { c.capture = v }
        }
        if let n = m["scanWindow"] {
            if Self.saysOff(n) { c.scanWindow = nil }
            else if let d = duration(n, "\(path).scanWindow", allowZero: false, min: PlanLimits.scanTiming.lowerBound, max: PlanLimits.scanTiming.upperBound) { c.scanWindow = d }
        }
        if let n = m["scanInterval"], let d = duration(n, "\(path).scanInterval", allowZero: false, min: PlanLimits.scanTiming.lowerBound, max: PlanLimits.scanTiming.upperBound) {
            c.scanInterval = d
            // An interval alone keeps the scanner listening all the time.
            if m["scanWindow"] == nil { c.scanWindow = d }
        }
        if let w = c.scanWindow, w > c.scanInterval { fail("\(path).scanWindow", m["scanWindow"], "\(Self.formatSeconds(w)) is longer than scanInterval (\(Self.formatSeconds(c.scanInterval)))") }
        if let n = m["reportRate"] {
            if Self.saysOff(n) { c.reportRate = nil } else if let v = number(n, "\(path).reportRate", in: 1...PlanLimits.maximumReportRate, what: "reports per second (or off)") { c.reportRate = v }
        }
        if let n = m["maxConnections"] {
            if Self.saysOff(n) { c.maxConnections = nil } else if let v = integer(n, "\(path).maxConnections", in: 1...PlanLimits.maximumConnectionLimit) { c.maxConnections = v }
        }
        if let n = m["discoveryTime"], let d = duration(n, "\(path).discoveryTime", max: PlanLimits.maximumConnectLatency) { c.discoveryTime = d }
        if let n = m["connectLoad"] {
            if Self.saysOff(n) { c.connectLoad = 0 } else if let v = number(n, "\(path).connectLoad", in: 0...1, what: "a probability (or off)") { c.connectLoad = v }
        }
        return c
    }

    mutating func thresholds(_ node: Node, _ path: String) -> Thresholds? {
        guard let m = mapping(node, path, known: ["detectionPct", "continuityPct", "pairContinuityPct", "timeToFirstDetection", "timeToFirstRead", "regressionTolerancePct"]) else { return nil }
        var t = Thresholds()
        if let n = m["detectionPct"], let v = number(n, "\(path).detectionPct", in: 0...100, what: "a percentage") { t.detectionPct = v }
        if let n = m["continuityPct"], let v = number(n, "\(path).continuityPct", in: 0...100, what: "a percentage") { t.continuityPct = v }
        if let n = m["pairContinuityPct"], let v = number(n, "\(path).pairContinuityPct", in: 0...100, what: "a percentage") { t.pairContinuityPct = v }
        if let n = m["timeToFirstDetection"], let d = duration(n, "\(path).timeToFirstDetection") { t.timeToFirstDetection = d }
        if let n = m["timeToFirstRead"], let d = duration(n, "\(path).timeToFirstRead") { t.timeToFirstRead = d }
        if let n = m["regressionTolerancePct"], let v = number(n, "\(path).regressionTolerancePct", in: 0...100, what: "percentage points") { t.regressionTolerancePct = v }
        return t
    }

    mutating func agents(_ node: Node, _ path: String, nodeCount: Int, radio: RadioKind) -> AgentSelection? {
        guard let m = mapping(node, path, known: ["count", "names", "tags", "dongles", "manufacturer", "firmware", "spares", "preflight"]) else { return nil }
        var a = AgentSelection()
        if let n = m["count"], let v = integer(n, "\(path).count", in: 1...10000) {
            if nodeCount > 0, v != nodeCount { fail("\(path).count", n, "is \(v) but the plan has \(nodeCount) nodes; one agent runs one node (spares: N checks N more)") } else { a.count = v }
        }
        if let n = m["names"], let v = stringList(n, "\(path).names", maxCount: PlanLimits.maximumNodes) {
            if nodeCount > 0, v.count != nodeCount { fail("\(path).names", n, "names \(v.count) agents but the plan has \(nodeCount) nodes") } else { a.names = v }
        }
        if let n = m["tags"], let v = stringList(n, "\(path).tags") { a.tags = v }
        if let n = m["dongles"], let v = nameList(n, "\(path).dongles", maxCount: PlanLimits.maximumNodes) {
            if nodeCount > 0, v.count != nodeCount { fail("\(path).dongles", n, "names \(v.count) dongles but the plan has \(nodeCount) nodes") }
            else if Set(v).count != v.count { fail("\(path).dongles", n, "names a dongle twice; one dongle runs one node") }
            else { a.dongles = v }
            if m["names"] != nil { fail("\(path).dongles", n, "give names (agents) or dongles, not both") }
        }
        if let n = m["manufacturer"], let v = oneOrMany(n, "\(path).manufacturer") {
            var ok = [String]()
            for (i, item) in v.enumerated() {
                let at = v.count == 1 && !Self.isSequence(n) ? "\(path).manufacturer" : "\(path).manufacturer[\(i)]"
                if Self.looksNumeric(item) {
                    if AgentSelection.parseNumber(item, in: 0...0xFFFF) == nil { fail(at, n, "\"\(item.prefix(64))\" is not a Bluetooth SIG company id (0 to 65535, or 0x0000 to 0xFFFF)") } else { ok.append(item) }
                } else if let problem = Self.labelProblem(item) { fail(at, n, "\"\(item.prefix(64))\" \(problem); write a company id (2, 0x000F) or a name herald-lab dongles shows (Intel)") } else { ok.append(item) }
            }
            a.manufacturer = ok
        }
        if let n = m["firmware"], let v = oneOrMany(n, "\(path).firmware") {
            var ok = [String]()
            for (i, item) in v.enumerated() {
                let at = v.count == 1 && !Self.isSequence(n) ? "\(path).firmware" : "\(path).firmware[\(i)]"
                if Self.looksNumeric(item) {
                    if AgentSelection.parseNumber(item, in: 0...0xFFFF) == nil { fail(at, n, "\"\(item.prefix(64))\" is not an LMP subversion (0 to 65535, or 0x0000 to 0xFFFF)") } else { ok.append(item) }
                } else if let problem = Self.labelProblem(item) { fail(at, n, "\"\(item.prefix(64))\" \(problem); write an LMP subversion (8870, 0x22a6) or the driver's firmware text") } else { ok.append(item) }
            }
            a.firmware = ok
        }
        if let n = m["spares"], let v = integer(n, "\(path).spares", in: 0...PlanLimits.maximumNodes) {
            if m["names"] != nil || m["dongles"] != nil { fail("\(path).spares", n, "spares stand in for dongles that fail their check; names and dongles choose every node's agent themselves") } else { a.spares = v }
        }
        if let n = m["preflight"] {
            if Self.saysOff(n) { a.preflight = 0 }
            else if let d = duration(n, "\(path).preflight", allowZero: false, min: 1, max: 600) { a.preflight = d }
        }
        if radio != .bluez {
            for key in ["dongles", "manufacturer", "firmware", "spares", "preflight"] where m[key] != nil {
                fail("\(path).\(key)", m[key], "selects or checks dongles, which only agents with radio kind bluez have (radio.kind is \(radio.rawValue))")
            }
        }
        return a
    }

    /// A name list (SafeName each).
    mutating func nameList(_ node: Node, _ path: String, maxCount: Int) -> [String]? {
        guard case .sequence(let seq) = node else { fail(path, node, "expected a list of names"); return nil }
        if seq.count > maxCount { fail(path, node, "has \(seq.count) entries; at most \(maxCount)"); return nil }
        var out = [String]()
        var bad = false
        for (i, item) in seq.enumerated() { if let s = name(item, "\(path)[\(i)]") { out.append(s) } else { bad = true } }
        return bad ? nil : out
    }

    /// One scalar or a list of them (at most 64).
    mutating func oneOrMany(_ node: Node, _ path: String) -> [String]? {
        if case .scalar(let s) = node { return [s.string] }
        return stringList(node, path)
    }

    static func isSequence(_ node: Node) -> Bool { if case .sequence = node { return true }; return false }

    static func looksNumeric(_ s: String) -> Bool {
        let t = s.trimmingCharacters(in: .whitespaces).lowercased()
        return !t.isEmpty && (t.hasPrefix("0x") || t.allSatisfy { $0.isNumber || $0 == "-" || $0 == "+" || $0 == "." })
    }

    /// Text a dongle property is matched against: 1 to 64 printable characters.
    static func labelProblem(_ s: String) -> String? {
        if s.isEmpty { return "is empty" }
        if s.utf8.count > 64 { return "is longer than 64 bytes" }
        if s.unicodeScalars.contains(where: { $0.properties.generalCategory == .control || $0.properties.generalCategory == .format }) { return "holds control characters" }
        return nil
    }
}
