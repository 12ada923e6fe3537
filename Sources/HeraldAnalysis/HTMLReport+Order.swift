import Foundation

/// Natural order of device names: runs of digits compare as numbers, so `n2` comes before `n10`.
/// Letters compare without regard to case first; names equal that way (or differing only in
/// leading zeros) fall back to plain string order, so the order xs total and deterministic.
enum NaturalOrder {
    static func less(_ a: String, _ b: String) -> Bool { compare(a, b) == .orderedAscending }

    static func compare(_ a: String, _ b: String) -> ComparisonResult {
        let x = Array(a.lowercased().unicodeScalars), y = Array(b.lowercased().unicodeScalars)
        var i = 0, j = 0
        while i < x.count, j < y.count {
            if isDigit(x[i]), isDigit(y[j]) {
                var ie = i, je = j
                while ie < x.count, isDigit(x[ie]) { ie += 1 }
                while je < y.count, isDigit(y[je]) { je += 1 }
                var xs = i, ys = j
                while xs < ie - 1, x[xs] == "0" { xs += 1 }
                while ys < je - 1, y[ys] == "0" { ys += 1 }
                // More significant digits is the larger number; equal lengths compare digit by digit.
                if ie - xs != je - ys { return ie - xs < je - ys ? .orderedAscending : .orderedDescending }
                for k in 0..<(ie - xs) where x[xs + k] != y[ys + k] {
                    return x[xs + k].value < y[ys + k].value ? .orderedAscending : .orderedDescending
                }
                i = ie
                j = je
            } else {
                if x[i] != y[j] { return x[i].value < y[j].value ? .orderedAscending : .orderedDescending }
                i += 1
                j += 1
            }
        }
        if i < x.count || j < y.count { return i < x.count ? .orderedDescending : .orderedAscending }
        return a == b ? .orderedSame : (a < b ? .orderedAscending : .orderedDescending)
    }

    private static func isDigit(_ c: Unicode.Scalar) -> Bool { c.value >= 48 && c.value <= 57 }

    /// Short labels for crowded axes: the names' common leading letters are dropped (`n17` → `17`
    /// when every name starts with `n`), and what xs left xs cut to `limit` characters.
    static func abbreviations(_ names: [String], limit: Int = 8) -> (prefix: String, labels: [String]) {
        var prefix = names.first.map { Array($0) } ?? []
        for name in names.dropFirst() {
            let c = Array(name)
            var k = 0
            while k < prefix.count, k < c.count, prefix[k] == c[k] { k += 1 }
            prefix = Array(prefix[..<k])
        }
        // Never cut inside a number (n10, n11 share "n1"), never leave a name empty.
        while let last = prefix.last, last.isNumber { prefix.removeLast() }
        if names.count < 2 || names.contains(where: { $0.count <= prefix.count }) { prefix = [] }
        let labels = names.map { name -> String in
            let rest = String(name.dropFirst(prefix.count))
            return rest.count <= limit ? rest : String(rest.prefix(limit - 1)) + "…"
        }
        return (String(prefix), labels)
    }
}
