import Foundation
import HeraldCore

/// junit.xml: stable names that CI can track across nights (`<plan>/<metric>/<node>`, never the
/// run id), `time=` on every suite and case, and by default one test case per node and metric
/// (a node fails a metric when any of its pairs as observer does; the message names them) plus
/// the headline figures; one per pair on request (`analyse --junit-pairs`).
enum JUnit {
    static func escape(_ s: String) -> String {
        // XML 1.0 cannot hold most control characters at all: show them as \u{XX}.
        let text = s.unicodeScalars.contains { $0.value < 0x20 && $0 != "\n" && $0 != "\t" } ? Format.label(s) : s
        // Most names and messages need nothing (one look at the bytes instead of four searches).
        guard text.utf8.contains(where: { $0 == 38 || $0 == 60 || $0 == 62 || $0 == 34 }) else { return text }
        return text.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;")
            .replacingOccurrences(of: ">", with: "&gt;").replacingOccurrences(of: "\"", with: "&quot;")
    }

    struct Case {
        var name: String
        var failure: String?
        var message: String
    }

    static func xml(_ r: AnalysisResult, perPair: Bool = false) -> String {
        let plan = r.input.plan ?? URL(fileURLWithPath: r.input.path).lastPathComponent
        var groups = [(String, [Case])]()
        func add(_ metric: String, _ c: Case) {
            if let i = groups.firstIndex(where: { $0.0 == metric }) { groups[i].1.append(c) } else { groups.append((metric, [c])) }
        }
        for c in r.checks {
            let isPair = c.subject.contains(" sees ")
            if !isPair || perPair {
                add(c.name, Case(name: c.subject, failure: c.passed ? nil : "\(c.name) of \(c.subject): \(c.message)", message: c.message))
            }
        }
        if !perPair {
            // One case per node (as observer) and metric.
            var order = [String]()
            var byNode = [String: [String: [AnalysisResult.Check]]]()
            var metrics = [String]()
            for c in r.checks where c.subject.contains(" sees ") {
                let node = String(c.subject[..<c.subject.range(of: " sees ")!.lowerBound])
                if byNode[node] == nil { order.append(node) }
                if !metrics.contains(c.name) { metrics.append(c.name) }
                byNode[node, default: [:]][c.name, default: []].append(c)
            }
            for metric in metrics {
                for node in order {
                    let cs = byNode[node]?[metric] ?? []
                    guard !cs.isEmpty else { continue }
                    let failed = cs.filter { !$0.passed }
                    let message = failed.isEmpty ? "\(cs.count) pair\(cs.count == 1 ? "" : "s") passed"
                        : "\(failed.count) of \(cs.count) pairs failed: " + failed.prefix(5).map { "\($0.subject): \($0.message)" }.joined(separator: "; ") + (failed.count > 5 ? "; …" : "")
                    add(metric, Case(name: node, failure: failed.isEmpty ? nil : "\(metric) of \(node): \(message)", message: message))
                }
            }
        }
        let total = groups.reduce(0) { $0 + $1.1.count }
        let failures = groups.reduce(0) { $0 + $1.1.filter { $0.failure != nil }.count }
        let time = String(format: "%.3f", max(0, r.elapsedSeconds))
        var out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
        out += "<testsuites name=\"herald-lab\" tests=\"\(total)\" failures=\"\(failures)\" time=\"\(time)\">\n"
        for (metric, cases) in groups {
            let suite = escape("\(plan)/\(metric)")
            out += "  <testsuite name=\"\(suite)\" tests=\"\(cases.count)\" failures=\"\(cases.filter { $0.failure != nil }.count)\" time=\"\(time)\">\n"
            for c in cases {
                out += "    <testcase classname=\"\(suite)\" name=\"\(escape("\(plan)/\(metric)/\(c.name)"))\" time=\"0\""
                if let f = c.failure {
                    out += "><failure message=\"\(escape(c.message))\">\(escape(f))</failure></testcase>\n"
                } else {
                    out += "><system-out>\(escape(c.message))</system-out></testcase>\n"
                }
            }
            out += "  </testsuite>\n"
        }
        out += "</testsuites>\n"
        return out
    }
}

/// The lines `herald-lab analyse` and `herald-lab run` print; the bundle's text in them (run id,
/// folders, problems) is escaped (`OutsideText`).
public enum Summary {
    public static func text(_ r: AnalysisResult, mode: AnalysisMode) -> String {
        let m = mode == .herald ? r.herald : r.strict
        let other = mode == .herald ? r.strict : r.herald
        var lines = [String]()
        lines.append("\(r.input.kind) \(OutsideText.escaped(r.input.runId ?? r.input.path)): \(m.phonescount) devices, contact event \(r.parameters.ceStart) to \(r.parameters.ceEnd) (\(r.parameters.cetotal) windows)")
        lines.append(String(format: "%@ mode: detection %ld of %ld pairs (%.2f%%), continuity %ld of %ld windows (%.4f%%, missed %.5f%%), longevity %.4f",
                            m.mode.rawValue, m.achieveddetections, m.maxpairs, m.detectionpct, m.achievedwindows, m.maxwindows, m.continuitypct, m.deltacewindowspct, m.longevity))
        lines.append(String(format: "%@ mode: detection %.2f%%, continuity %.4f%%, longevity %.4f", other.mode.rawValue, other.detectionpct, other.continuitypct, other.longevity))
        for d in r.devices where d.flagged { lines.append("flagged: \(OutsideText.escaped(d.folder)): \(OutsideText.escaped(d.problems.joined(separator: "; ")))") }
        let failed = r.checks.filter { !$0.passed }
        if r.input.aborted == true {
            lines.append("verdict: none (the run was aborted: its figures cover the logs until then, and it is in no trend, baseline or verdict count)")
            return lines.joined(separator: "\n")
        }
        lines.append(r.passed ? "verdict: PASS (\(r.checks.count) checks)" : "verdict: FAIL (\(failed.count) of \(r.checks.count) checks failed; first: \(failed[0].name) \(OutsideText.escaped(failed[0].subject)): \(OutsideText.escaped(failed[0].message)))")
        return lines.joined(separator: "\n")
    }
}
