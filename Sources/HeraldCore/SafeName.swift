/// Names that become folder or file names (plans, runs, nodes, agents): letters, digits, `-`,
/// `_`, `.`, not starting with `.` or `-`, at most 64 characters. Nothing named this way can escape its
/// folder. The one check of names from outside, used wherever a name is used.
public enum SafeName {
    public static func problem(with name: String) -> String? {
        if name.isEmpty { return "is empty" }
        if name.count > 64 { return "is longer than 64 characters" }
        if name.hasPrefix(".") { return "must not start with '.'" }
        // A name that reaches a command line (tar's operands) must not read as an option.
        if name.hasPrefix("-") { return "must not start with '-'" }
        for c in name.unicodeScalars {
            let ok = (c >= "a" && c <= "z") || (c >= "A" && c <= "Z") || (c >= "0" && c <= "9") || c == "-" || c == "_" || c == "."
            if !ok { return "may hold only letters, digits, '-', '_' and '.' (found \"\(c)\")" }
        }
        return nil
    }
    public static func isValid(_ name: String) -> Bool { problem(with: name) == nil }
}
