import ArgumentParser
import Foundation
import HeraldCore
import LabAgent
import LabCoordinator
import LabHTTP
import LabPlan
import RadioAir
import RadioSim
import Logging
#if canImport(Glibc)
import Glibc
#endif

/// `herald-lab-bench`: the harness benchmarks `make bench` runs (arm, gather, hash), a program of
/// their own so that the herald-lab a node installs (the .deb) carries no benchmark code. Figures
/// and ratios are printed, never asserted. `arm` is in BenchArm.swift. `calibrate` (Calibrate.swift,
/// make test-calibration) is the one command with checks: statistical calibration, not speed.
@main
struct HeraldLabBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "herald-lab-bench",
        abstract: "HeraldLab's harness benchmarks (make bench): figures, never asserted.",
        subcommands: [BenchArm.self, BenchCommand.Gather.self, BenchCommand.Hash.self, Calibrate.self, BenchResults.self])
}

/// A line on stderr.
func log(_ text: String) {
    FileHandle.standardError.write(Data((text + "\n").utf8))
}

enum BenchCommand {

    struct Hash: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "SHA-256 speed on a file.")
        @Argument var file: String
        func run() throws {
            let t0 = Date()
            let (sha, bytes) = try SHA256.hash(fileAt: URL(fileURLWithPath: file))
            let s = Date().timeIntervalSince(t0)
            print(String(format: "%@  %.0f MB in %.2f s: %.0f MB/s", sha, Double(bytes) / 1_048_576, s, Double(bytes) / 1_048_576 / s))
        }
    }

    struct Gather: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Gather throughput on loopback: files served by an agent, fetched and verified by the coordinator.")
        @Option(help: "Megabytes of logs on the agent.") var megabytes = 400

        func run() async throws {
            let dir = FileManager.default.temporaryDirectory.appendingPathComponent("heraldlab-bench-gather-\(getpid())")
            defer { try? FileManager.default.removeItem(at: dir) }
            let quiet = { (label: String) in Logger(label: label) { _ in SwiftLogNoOpLogHandler() } }
            // A finished run on the agent's disk, as an agent leaves it.
            let runId = "bench-gather"
            let runDir = dir.appendingPathComponent("agent/runs/\(runId)")
            let nodeDir = runDir.appendingPathComponent("node")
            try FileManager.default.createDirectory(at: nodeDir, withIntermediateDirectories: true)
            let plan = try Plan.parse(yaml: "name: g\nduration: 1h\nnodes: [a, b]\n")
            try LabJSON.encoder.encode(NodeAssignment(runId: runId, plan: plan, node: plan.nodes[0])).write(to: runDir.appendingPathComponent("assignment.json"))
            var line = Data("2026-01-01 00:00:00.000+0000,BLE,C0:00:00:00:00:01,,,3,,,,,RSSI:-55.0\n".utf8)
            var block = Data()
            while block.count < 1 << 20 { block.append(line) }
            line = Data()
            var files = [LabWire.FileInfo]()
            for name in ["contacts.csv", "detection.csv", "statistics.csv", "battery.csv", "log.txt"] {
                let url = nodeDir.appendingPathComponent(name)
                FileManager.default.createFile(atPath: url.path, contents: nil)
                let h = try FileHandle(forWritingTo: url)
                let mb = name == "contacts.csv" ? megabytes : 1
                for _ in 0..<mb { try h.write(contentsOf: block) }
                try h.close()
                let (sha, bytes) = try SHA256.hash(fileAt: url)
                files.append(LabWire.FileInfo(name: name, bytes: bytes, sha256: sha))
            }
            let state: [String: Any] = ["state": "finished", "resumed": false, "startAt": 0, "startedAt": 0,
                                        "files": files.map { ["name": $0.name, "bytes": $0.bytes, "sha256": $0.sha256] }]
            try JSONSerialization.data(withJSONObject: state).write(to: runDir.appendingPathComponent("state.json"))
            let token = LabToken.generate()
            var ac = Agent.Config(name: "agent", dataDirectory: dir.appendingPathComponent("agent"))
            ac.token = token
            let agent = Agent(config: ac, logger: quiet("herald-lab.agent"))
            let agentPort = try await agent.start()
            var cc = Coordinator.Config(results: dir.appendingPathComponent("results"))
            cc.token = token
            let coordinator = try Coordinator(config: cc, logger: quiet("herald-lab.coordinator"))
            let total = files.reduce(Int64(0)) { $0 + $1.bytes }
            if FileManager.default.isExecutableFile(atPath: "/usr/bin/curl") {
                let p = Process()
                p.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
                p.arguments = ["-s", "-o", "/dev/null", "-w", "%{speed_download}", "-H", "Authorization: Bearer \(token)", "http://127.0.0.1:\(agentPort)/v1/runs/\(runId)/files/contacts.csv"]
                let pipe = Pipe()
                p.standardOutput = pipe
                try p.run()
                p.waitUntilExit()
                let speed = Double(String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)) ?? 0
                print(String(format: "(reference: curl fetches the same file from the agent at %.0f MB/s)", speed / 1_048_576))
            }
            let t0 = Date()
            let bytes = try await coordinator.fetchFiles(agentURL: "http://127.0.0.1:\(agentPort)", runId: runId, node: "a", into: dir.appendingPathComponent("gathered"))
            let seconds = Date().timeIntervalSince(t0)
            let mb = Double(bytes) / 1_048_576
            print(String(format: "gather %.0f MB in %.2f s, SHA-256 verified, fsynced: %.0f MB/s (target >= 1000 MB/s; SHA-256 on %@)",
                         mb, seconds, mb / seconds, SHA256.isAccelerated ? "SHA-NI" : "portable C"))
            precondition(bytes == total)
            await agent.stop()
            // The disk's own write rates, for reference, after the gather (so as not to disturb
            // it), the same size on the same file system.
            if let direct = Self.dd(in: dir, megabytes: megabytes, blockMiB: 4, flag: "oflag=direct"),
               let synced = Self.dd(in: dir, megabytes: megabytes, blockMiB: 1, flag: "conv=fsync") {
                print(String(format: "(reference: this disk takes %.0f MB/s with O_DIRECT (dd bs=4M oflag=direct), %.0f MB/s through the page cache then fsync (dd bs=1M conv=fsync))",
                             direct, synced))
            }
        }

        /// MB/s of `dd` writing `megabytes` of zeros into `dir` with `flag`; nil without dd.
        static func dd(in dir: URL, megabytes: Int, blockMiB: Int, flag: String) -> Double? {
            guard FileManager.default.isExecutableFile(atPath: "/bin/dd") else { return nil }
            let target = dir.appendingPathComponent("dd-probe")
            defer { try? FileManager.default.removeItem(at: target) }
            let p = Process()
            p.executableURL = URL(fileURLWithPath: "/bin/dd")
            p.arguments = ["if=/dev/zero", "of=\(target.path)", "bs=\(blockMiB)M", "count=\(max(1, megabytes / blockMiB))", flag]
            p.environment = ["LC_ALL": "C"]
            let err = Pipe()
            p.standardError = err
            p.standardOutput = FileHandle.nullDevice
            guard (try? p.run()) != nil else { return nil }
            let text = String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            p.waitUntilExit()
            // "1048576000 bytes (1.0 GB, 1000 MiB) copied, 0.689 s, 1.5 GB/s"
            guard p.terminationStatus == 0, let line = text.split(separator: "\n").last(where: { $0.contains(" copied, ") }),
                  let bytes = Double(line.split(separator: " ").first ?? ""),
                  let seconds = line.components(separatedBy: " copied, ").last?.split(separator: " ").first.flatMap({ Double($0) }), seconds > 0
            else { return nil }
            return bytes / 1_048_576 / seconds
        }
    }
}
