import ArgumentParser
import Foundation
import HeraldCore

/// The command line's shared conventions (issue 40, item 7): `--json [FILE]` the same on every
/// command that emits results, did-you-mean for subcommands and keyword values, and hints that
/// carry the options needed to paste them. Pure functions, tested in HeraldLabCLITests.
enum CLIConventions {
    // MARK: --json [FILE]

    /// `--json` with no FILE means standard output. ArgumentParser has no option with an optional
    /// value, so the command line is normalised before parsing: `--json` followed by nothing, by
    /// another option, or by an argument that is not a JSON file to write (an existing folder or
    /// an existing file not ending in .json, such as the bundle or the plan the command reads)
    /// becomes `--json=-`. `--json FILE` keeps FILE when it is `-`, ends in `.json`, or names
    /// nothing yet; `--json=FILE` is always FILE. Nothing after `--` is touched.
    static func normalizeJSON(_ args: [String], exists: (String) -> Bool = { FileManager.default.fileExists(atPath: $0) }) -> [String] {
        var out = [String]()
        var i = 0
        while i < args.count {
            let a = args[i]
            if a == "--" { out.append(contentsOf: args[i...]); break }
            guard a == "--json" else { out.append(a); i += 1; continue }
            if i + 1 < args.count {
                let next = args[i + 1]
                let isFile = next == "-" || (!next.hasPrefix("-") && (next.hasSuffix(".json") || !exists(next)))
                if isFile { out.append(contentsOf: [a, next]); i += 2; continue }
            }
            out.append("--json=-")
            i += 1
        }
        return out
    }

    /// Writes a command's JSON: to standard output for `-`, else to the file (atomically; a
    /// failure names the file, exit 2).
    static func writeJSON(_ data: Data, to destination: String, command: String) throws {
        if destination == "-" {
            FileHandle.standardOutput.write(data)
            if data.last != UInt8(ascii: "\n") { FileHandle.standardOutput.write(Data("\n".utf8)) }
            return
        }
        do {
            let url = URL(fileURLWithPath: destination)
            try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
            try data.write(to: url, options: .atomic)
        } catch {
            log("herald-lab \(command): --json \(OutsideText.escaped(destination)): cannot write: \(error.localizedDescription)")
            throw ExitCode(2)
        }
    }

    // MARK: Did you mean

    /// Edit distance (insertions, deletions, substitutions, and swaps of neighbours), case-blind.
    static func distance(_ a: String, _ b: String) -> Int {
        let x = Array(a.lowercased()), y = Array(b.lowercased())
        if x.isEmpty { return y.count }
        if y.isEmpty { return x.count }
        var d = [[Int]](repeating: [Int](repeating: 0, count: y.count + 1), count: x.count + 1)
        for i in 0...x.count { d[i][0] = i }
        for j in 0...y.count { d[0][j] = j }
        for i in 1...x.count {
            for j in 1...y.count {
                d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (x[i - 1] == y[j - 1] ? 0 : 1))
                if i > 1, j > 1, x[i - 1] == y[j - 2], x[i - 2] == y[j - 1] { d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1) }
            }
        }
        return d[x.count][y.count]
    }

    /// The candidate `word` is most likely a slip for: within a third of its length in edits
    /// (at least 1, at most 3), or a candidate it begins (3 characters or more); nil when none is
    /// close or `word` is a candidate itself.
    static func suggestion(for word: String, among candidates: [String]) -> String? {
        guard !word.isEmpty, word.count <= 200, !candidates.contains(word) else { return nil }
        let limit = min(3, max(1, word.count / 3))
        let scored = candidates.map { ($0, distance(word, $0)) }.filter { $0.1 <= limit }
        if let best = scored.min(by: { $0.1 < $1.1 || ($0.1 == $1.1 && $0.0 < $1.0) }) { return best.0 }
        if word.count >= 3, let prefixed = candidates.filter({ $0.lowercased().hasPrefix(word.lowercased()) }).sorted().first { return prefixed }
        return nil
    }

    /// " (did you mean 'x'?)" or "".
    static func didYouMean(_ word: String, among candidates: [String]) -> String {
        suggestion(for: word, among: candidates).map { "; did you mean '\(OutsideText.escaped($0))'?" } ?? ""
    }

    /// A subcommand word that is not one: the error to give (with the close one), or nil when the
    /// command line names subcommands correctly (or the word may be a command's argument: a
    /// command with a default subcommand takes arguments, and a path that exists is one).
    static func unknownSubcommand(_ args: [String], root: ParsableCommand.Type, exists: (String) -> Bool = { FileManager.default.fileExists(atPath: $0) }) -> String? {
        var command = root
        var path = [root._commandName]
        for word in args {
            let subs = command.configuration.subcommands
            guard !subs.isEmpty, !word.hasPrefix("-") else { return nil }
            let names = subs.flatMap { [$0._commandName] + $0.configuration.aliases }
            if let next = subs.first(where: { $0._commandName == word || $0.configuration.aliases.contains(word) }) {
                command = next
                path.append(word)
                continue
            }
            if word == "help" { return nil }
            let hasDefault = command.configuration.defaultSubcommand != nil
            if hasDefault && exists(word) { return nil }
            let close = suggestion(for: word, among: names.filter { !$0.isEmpty })
            if hasDefault && close == nil { return nil }
            return "\(path.joined(separator: " ")): unknown command '\(OutsideText.escaped(word, limit: 64))'"
                + (close.map { "; did you mean '\($0)'?" } ?? " (commands: \(names.joined(separator: ", ")))")
        }
        return nil
    }

    // MARK: Hints to paste

    /// A word as a POSIX shell reads it back: as it is when it holds only safe characters, else
    /// in single quotes.
    static func shellQuoted(_ s: String) -> String {
        let safe = CharacterSet(charactersIn: "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=@%+,")
        if !s.isEmpty, s.unicodeScalars.allSatisfy({ safe.contains($0) }) { return s }
        return "'" + s.replacingOccurrences(of: "'", with: "'\\''") + "'"
    }
}
