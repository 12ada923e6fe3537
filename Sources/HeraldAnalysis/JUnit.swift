import Foundation
import HeraldCore

/// junit.xml: one test case per pair and metric (and the headline figures), judged against the
/// plan's thresholds, so CI systems show a run's verdict.
enum JUnit {
    static func escape(_ s: String) -> String {
        // Most names and messages need nothing (one look at the bytes instead of four searches).
        guard s.utf8.contains(where: { $0 == 38 || $0 == 60 || $0 == 62 || $0 == 34 }) else { return s }
        return s.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;")
            .replacingOccurrences(of: ">", with: "&gt;").replacingOccurrences(of: "\"", with: "&quot;")
    }

    static func xml(_ r: AnalysisResult) -> String {
        let name = r.input.runId ?? URL(fileURLWithPath: r.input.path).lastPathComponent
        let failures = r.checks.filter { !$0.passed }.count
        var out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
        out += "<testsuites name=\"herald-lab\" tests=\"\(r.checks.count)\" failures=\"\(failures)\">\n"
        var groups = [String: [AnalysisResult.Check]]()
        var order = [String]()
        for c in r.checks {
            if groups[c.name] == nil { order.append(c.name) }
            groups[c.name, default: []].append(c)
        }
        for g in order {
            let cs = groups[g]!
            out += "  <testsuite name=\"\(escape(name)).\(escape(g))\" tests=\"\(cs.count)\" failures=\"\(cs.filter { !$0.passed }.count)\">\n"
            for c in cs {
                out += "    <testcase classname=\"\(escape(name)).\(escape(g))\" name=\"\(escape(c.subject))\""
                if c.passed {
                    out += "><system-out>\(escape(c.message))</system-out></testcase>\n"
                } else {
                    out += "><failure message=\"\(escape(c.message))\">\(escape(c.name)) of \(escape(c.subject)): \(escape(c.message))</failure></testcase>\n"
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
    public static func text(_ r: AnalysisResult, mode: String) -> String {
        let m = mode == "herald" ? r.herald : r.strict
        let other = mode == "herald" ? r.strict : r.herald
        var lines = [String]()
        lines.append("\(r.input.kind) \(OutsideText.escaped(r.input.runId ?? r.input.path)): \(m.phonescount) devices, contact event \(r.parameters.ceStart) to \(r.parameters.ceEnd) (\(r.parameters.cetotal) windows)")
        lines.append(String(format: "%@ mode: detection %ld of %ld pairs (%.2f%%), continuity %ld of %ld windows (%.4f%%, missed %.5f%%), longevity %.4f",
                            m.mode, m.achieveddetections, m.maxpairs, m.detectionpct, m.achievedwindows, m.maxwindows, m.continuitypct, m.deltacewindowspct, m.longevity))
        lines.append(String(format: "%@ mode: detection %.2f%%, continuity %.4f%%, longevity %.4f", other.mode, other.detectionpct, other.continuitypct, other.longevity))
        for d in r.devices where d.flagged { lines.append("flagged: \(OutsideText.escaped(d.folder)): \(OutsideText.escaped(d.problems.joined(separator: "; ")))") }
        let failed = r.checks.filter { !$0.passed }
        lines.append(r.passed ? "verdict: PASS (\(r.checks.count) checks)" : "verdict: FAIL (\(failed.count) of \(r.checks.count) checks failed; first: \(failed[0].name) \(OutsideText.escaped(failed[0].subject)): \(OutsideText.escaped(failed[0].message)))")
        return lines.joined(separator: "\n")
    }
}
