/// Text from the network or from a plan (names, agents' messages and gap reasons, file-list
/// fields, tags, URLs) on its way into a log line or onto a terminal: data, never terminal input.
/// The one escaping every log line and every CLI output of outside text goes through.
///
/// Shown as visible escapes: the backslash itself (`\\`), C0 controls (ESC, CR, LF, ... as
/// `\x1B`), DEL and C1 controls (`\x7F`, `\u{9B}`), line and paragraph separators, and the
/// Unicode direction marks and overrides that reorder what a terminal shows (U+200E, U+200F,
/// U+202A-U+202E, U+2066-U+2069, as `\u{202E}`). With `quotes`, `"` becomes `\"` (for text
/// shown between quotes). Everything else is kept as it is.
public enum OutsideText {
    /// Whether `u` is shown as an escape.
    public static func isEscaped(_ u: Unicode.Scalar) -> Bool {
        switch u.value {
        case 0..<0x20, 0x7F...0x9F, 0x2028, 0x2029, 0x200E, 0x200F, 0x202A...0x202E, 0x2066...0x2069: return true
        default: return false
        }
    }

    /// `text` with every character that could act on a terminal or forge a line shown as an
    /// escape; at most `limit` characters of the original (then "..."), nil: all of it.
    public static func escaped(_ text: String, limit: Int? = nil, quotes: Bool = false, backslashes: Bool = true) -> String {
        var out = ""
        var count = 0
        for u in text.unicodeScalars {
            if let limit, count == limit { return out + "..." }
            count += 1
            switch u {
            case "\\" where backslashes: out += "\\\\"
            case "\"" where quotes: out += "\\\""
            case _ where u.value < 0x80 && isEscaped(u): out += "\\x" + hex(u.value, width: 2)
            case _ where isEscaped(u): out += "\\u{" + hex(u.value, width: 4) + "}"
            default: out.unicodeScalars.append(u)
            }
        }
        return out
    }

    /// A whole log line as it reaches the log: every control character or direction mark that
    /// slipped into it shown as an escape, so that one line stays one line whatever it carries.
    /// Backslashes are kept (fields already escaped keep their escapes readable). Services
    /// (coordinator, agent, air) pass every line through this at their log sink.
    public static func line(_ text: String) -> String { escaped(text, backslashes: false) }

    /// Text for an HTML page (element content or a quoted attribute value): `&`, `<`, `>`, `"`
    /// and `'` as character references, so no outside text ever becomes markup. Pages build
    /// every piece of outside text through this (report.html, the coordinator's dashboard).
    /// Control characters (but line breaks and tabs) and direction marks become visible escapes.
    public static func html(_ text: String) -> String {
        var out = ""
        out.reserveCapacity(text.utf8.count)
        for u in text.unicodeScalars {
            switch u {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&#39;"
            // Controls and direction marks are shown as escapes, as on a terminal: an agent's
            // U+202E must not reorder the page it is shown on (HostileAgentTests).
            case "\n", "\t", "\r": out.unicodeScalars.append(u)
            case _ where isEscaped(u): out += "\\u{" + hex(u.value, width: 4) + "}"
            default: out.unicodeScalars.append(u)
            }
        }
        return out
    }

    private static func hex(_ v: UInt32, width: Int) -> String {
        let s = String(v, radix: 16, uppercase: true)
        return String(repeating: "0", count: max(0, width - s.count)) + s
    }
}
