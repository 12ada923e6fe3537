import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// Issue 40, item 7: `scripts/lab.sh` (what `make lab` runs) stops its children on TERM within
/// 5 s. It waited in `sleep 3600`, a foreground command that holds a trap back until it ends; it
/// now waits with `wait`, so the trap runs at once. The lab (air, coordinator, one agent) is
/// started as `make lab` starts it, and every wait here is on a condition with a deadline.
final class LabScriptTests: XCTestCase {
    /// The processes whose parent is `pid` (from /proc).
    func children(of pid: pid_t) -> [pid_t] {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        return entries.compactMap { name -> pid_t? in
            guard let p = pid_t(name), let stat = try? String(contentsOfFile: "/proc/\(name)/stat", encoding: .utf8),
                  let close = stat.range(of: ")", options: .backwards) else { return nil }
            // pid (comm) state ppid ...
            let fields = stat[close.upperBound...].split(separator: " ")
            return fields.count > 1 && pid_t(fields[1]) == pid ? p : nil
        }
    }

    func alive(_ pid: pid_t) -> Bool {
        guard kill(pid, 0) == 0 else { return false }
        // A zombie has stopped; only its parent's wait is missing.
        let stat = (try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)) ?? ""
        guard let close = stat.range(of: ")", options: .backwards) else { return false }
        return !stat[close.upperBound...].trimmingCharacters(in: .whitespaces).hasPrefix("Z")
    }

    func testTheLabStopsItsChildrenOnTermWithinFiveSeconds() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("labsh-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let out = dir.appendingPathComponent("out.log")
        FileManager.default.createFile(atPath: out.path, contents: nil)
        let handle = try FileHandle(forWritingTo: out)
        let script = Process()
        script.executableURL = URL(fileURLWithPath: "/bin/bash")
        script.arguments = [LabProcesses.root.appendingPathComponent("scripts/lab.sh").path, "--serve", "1", dir.appendingPathComponent("results").path]
        script.currentDirectoryURL = LabProcesses.root
        var env = ProcessInfo.processInfo.environment
        env["BIN"] = LabProcesses.binary.path
        env["LAB_WORK"] = dir.appendingPathComponent("work").path
        script.environment = env
        script.standardOutput = handle
        script.standardError = handle
        try script.run()
        defer { if script.isRunning { kill(script.processIdentifier, SIGKILL) } }
        let pid = script.processIdentifier
        func log() -> String { (try? String(contentsOf: out, encoding: .utf8)) ?? "" }

        var deadline = Date().addingTimeInterval(120)
        while !log().contains("lab: up until Ctrl-C") && script.isRunning && Date() < deadline { usleep(50_000) }
        XCTAssertTrue(log().contains("lab: up until Ctrl-C"), "the lab came up: \(log())")
        // The air, the coordinator and the agent (and the sleep the script waits on).
        let started = children(of: pid)
        XCTAssertGreaterThanOrEqual(started.count, 3, "children of lab.sh: \(started)")

        let termAt = Date()
        kill(pid, SIGTERM)
        deadline = termAt.addingTimeInterval(10)
        while script.isRunning && Date() < deadline { usleep(20_000) }
        let took = Date().timeIntervalSince(termAt)
        XCTAssertFalse(script.isRunning, "lab.sh still running \(took) s after TERM")
        XCTAssertLessThan(took, 5, "lab.sh stopped \(took) s after TERM")
        let left = started.filter(alive)
        XCTAssertEqual(left, [], "children still running after lab.sh ended")
        for p in left { kill(p, SIGKILL) }
        XCTAssertTrue(log().contains("lab: logs kept in"), log())
    }
}
