import ArgumentParser
import Foundation
import HeraldAnalysis
import HeraldCore
import LabCoordinator
import LabHTTP
import LabPlan
#if canImport(Glibc)
import Glibc
#endif

/// `herald-lab run PLAN --coordinator URL`
struct RunCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "run",
        abstract: "Submit a plan to a coordinator, show the nodes live, fetch the bundle and exit with the plan's verdict (0 pass, 1 fail, 2 error)."
    )

    @Argument(help: "Plan file (YAML).")
    var plan: String

    @OptionGroup var options: CoordinatorOptions
    var coordinator: String { options.coordinator }

    @Option(help: "Folder to unpack the bundle into (default: results).")
    var out: String = "results"

    func run() async throws {
        let parsed = try loadPlan(plan) // refuse a bad plan here, with field paths
        let personas = parsed.nodes.filter { $0.persona != nil }
        if !personas.isEmpty {
            log("herald-lab run: \(plan): \(personas.map { "\($0.name) (\($0.persona!.rawValue))" }.joined(separator: ", ")): personas are simulated phones; a lab runs Linux nodes only (herald-lab simulate runs personas)")
            throw ExitCode(2)
        }
        let text = try String(contentsOfFile: plan, encoding: .utf8)
        let client = try options.client()
        let (status, body, _) = try await client.request("POST", "/v1/runs?name=\(URL(fileURLWithPath: plan).lastPathComponent)", body: Data(text.utf8))
        guard status == 201, let record = try? JSONDecoder().decode(RunRecord.self, from: body) else {
            let message = (try? JSONDecoder().decode([String: String].self, from: body))?["error"] ?? String(decoding: body, as: UTF8.self)
            log("herald-lab run: the coordinator refused the plan (HTTP \(status)):\n\(OutsideText.escaped(message))")
            throw ExitCode(2)
        }
        print("run \(record.id) submitted: \(record.nodes.count) nodes for \(formatDuration(record.duration))")
        let live = isatty(STDOUT_FILENO) == 1
        var drawnLines = 0
        var lastPlain = Date.distantPast
        var current = record
        var unanswered: Date?
        while true {
            do {
                current = try await client.call("GET", "/v1/runs/\(record.id)")
                unanswered = nil
            } catch {
                // A coordinator that is gone for a minute is given up on (it keeps the run if it comes back).
                let since = unanswered ?? Date()
                unanswered = since
                if Date().timeIntervalSince(since) > 60 {
                    log("herald-lab run: the coordinator at \(coordinator) has not answered for 60 s (\(error)); run \(record.id) is still recorded there: `herald-lab runs list` shows it")
                    throw ExitCode(2)
                }
            }
            let lines = Self.table(current)
            if live {
                if drawnLines > 0 { print("\u{1B}[\(drawnLines)A", terminator: "") }
                for l in lines { print("\u{1B}[2K" + l) }
                drawnLines = lines.count
            } else if Date().timeIntervalSince(lastPlain) >= 10 || current.state.isFinal {
                print(lines.joined(separator: "\n"))
                lastPlain = Date()
            }
            fflush(nil)
            if current.state.isFinal { break }
            try await Task.sleep(nanoseconds: 1_000_000_000)
        }
        guard current.state == .complete || current.state == .aborted else {
            log("herald-lab run: run \(current.id) \(current.state.rawValue): \(OutsideText.escaped(current.message ?? ""))")
            for n in current.nodes where n.message != nil { log("  \(n.name) (agent \(n.agent), \(OutsideText.escaped(n.agentURL))): \(OutsideText.escaped(n.state)): \(OutsideText.escaped(n.message!))") }
            throw ExitCode(2)
        }
        // Fetch the bundle to disk (streamed, hashed on the way), check it, unpack it.
        let outDir = URL(fileURLWithPath: out)
        try FileManager.default.createDirectory(at: outDir, withIntermediateDirectories: true)
        let tarURL = outDir.appendingPathComponent("\(current.id).tar.gz")
        let part = outDir.appendingPathComponent(".\(current.id).tar.gz.part")
        FileManager.default.createFile(atPath: part.path, contents: nil)
        var hasher = SHA256()
        do {
            let result = try FileDownload.get(client.base.appendingPathComponent("v1/runs/\(current.id)/bundle"), headers: client.token.map { ["Authorization": "Bearer \($0)"] } ?? [:],
                                              appendingTo: part, hasher: &hasher, timeout: 120)
            guard result.status == 200 else { throw LabClient.Failure(status: result.status, message: "unexpected status") }
        } catch {
            try? FileManager.default.removeItem(at: part)
            log("herald-lab run: cannot fetch the bundle of \(current.id): \(error)")
            throw ExitCode(2)
        }
        let sha = hasher.finalizeHex()
        if let expected = current.bundleSha256, expected != sha {
            try? FileManager.default.removeItem(at: part)
            log("herald-lab run: the bundle of \(current.id) arrived damaged (SHA-256 \(sha), the coordinator says \(expected)); fetch it again with `herald-lab run` or from \(coordinator)/v1/runs/\(current.id)/bundle")
            throw ExitCode(2)
        }
        _ = try? FileManager.default.removeItem(at: tarURL)
        try FileManager.default.moveItem(at: part, to: tarURL)
        let tar = Process()
        tar.executableURL = URL(fileURLWithPath: "/bin/tar")
        tar.arguments = ["-xzf", tarURL.path, "-C", outDir.path, "--no-same-owner", "--no-same-permissions"]
        try tar.run()
        tar.waitUntilExit()
        guard tar.terminationStatus == 0 else {
            log("herald-lab run: tar could not unpack \(tarURL.path) (exit \(tar.terminationStatus))")
            throw ExitCode(2)
        }
        let bundle = outDir.appendingPathComponent(current.id)
        print("bundle: \(bundle.path)")
        if let m = try? Manifest.read(from: bundle.appendingPathComponent("manifest.json")) {
            let offsets = m.nodes.map { String(format: "%@ %+.2f ms", $0.name, $0.clockOffset * 1000) }.joined(separator: ", ")
            if let s = m.startSkew { print(String(format: "start skew: p50 %.3f ms, p99 %.3f ms, max %.3f ms; clock offsets: %@", s.p50Ms, s.p99Ms, s.maxMs, offsets)) }
            if let pf = m.preflight {
                let left = pf.filter { !$0.ok }
                print("pre-flight: \(pf.count - left.count) of \(pf.count) dongles passed" + (left.isEmpty ? "" : "; left out: " + left.map { OutsideText.escaped("\($0.dongle) (\($0.reason ?? "failed"))") }.joined(separator: ", ")))
            }
            let partial = m.nodes.filter { $0.state != .complete }
            if !partial.isEmpty { print("nodes not complete: " + partial.map { OutsideText.escaped("\($0.name) \($0.state.rawValue)\($0.message.map { " (\($0))" } ?? "")") }.joined(separator: ", ")) }
        }
        if current.state == .aborted { log("herald-lab run: run \(current.id) was aborted; its bundle holds what the nodes logged until then") }
        if let summary = try? ReportWriter.readSummary(bundle.appendingPathComponent("report/summary.json")) {
            print(Summary.text(summary, mode: "strict"))
            print("report: \(bundle.appendingPathComponent("report/report.html").path)")
            if !summary.passed { throw ExitCode(1) }
            if current.state == .aborted { throw ExitCode(2) }
        } else {
            log("herald-lab run: the bundle has no report (\(OutsideText.escaped(current.message ?? "analysis failed")))")
            throw ExitCode(2)
        }
    }

    static func table(_ r: RunRecord) -> [String] {
        var lines = ["run \(OutsideText.escaped(r.id)): \(r.state.rawValue)\(r.startAt.map { t in r.state == .running ? String(format: " (%.0f s left)", max(0, t + r.duration - Date().timeIntervalSince1970)) : "" } ?? "")"]
        lines.append("node            agent           state      peers  reads  RSSI/min")
        for n in r.nodes {
            let s = n.status
            // Names, agents and states are the agents' and the plan's text: escaped.
            let (name, agent, state) = (OutsideText.escaped(n.name), OutsideText.escaped(n.agent), OutsideText.escaped(n.state))
            lines.append(String(format: "%@ %@ %@ %5d  %5d  %8d", name.padding(toLength: 15, withPad: " ", startingAt: 0), agent.padding(toLength: 15, withPad: " ", startingAt: 0),
                                state.padding(toLength: 10, withPad: " ", startingAt: 0), s?.peersDetected ?? 0, s?.payloadsRead ?? 0, s?.rssiLastMinute ?? 0))
        }
        return lines
    }
}
