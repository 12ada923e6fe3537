import ArgumentParser
import Foundation
import HeraldCore
import LabAgent
import LabCoordinator
import LabHTTP
import LabPlan
import RadioAir
import Logging
#if canImport(Glibc)
import Glibc
#endif

/// `herald-lab-bench arm`: N agents, each with its own HTTP listener, in this process,
/// registered and heartbeating with a coordinator that runs as a process of its own (so that
/// its memory is its own); the time from submitting a plan for all N to the run being armed
/// and started, and the coordinator's resident memory.
struct BenchArm: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "arm",
        abstract: "Time to arm N heartbeating agents, each with its own HTTP listener, in one process; the coordinator's memory.")
    @Option var agents = 200
    @Option(help: "Seconds between an agent's heartbeats (as agents send them by default).") var heartbeat = 1.0
    @Option(help: "Seconds of heartbeats before the measurement: a lab's agents heartbeat long before a run, and arming takes each agent's clock from its heartbeats of the last 30 s.") var settle = 32.0
    @Flag(help: "Keep the agents' state on disk (the temporary folder), not in /dev/shm.") var disk = false
    @Option(help: "Arm this many times (a fresh run each time), printing each.") var repeats = 1

    func run() async throws {
        Bench.raiseFileLimit()
        // The agents' state goes to memory (/dev/shm) when it can: every agent fsyncs its
        // assignment when armed, and here a thousand agents share one disk, where in a lab each
        // has its own. `--disk` keeps them on the temporary folder's disk.
        let shm = URL(fileURLWithPath: "/dev/shm")
        let root = !disk && FileManager.default.isWritableFile(atPath: shm.path) ? shm : FileManager.default.temporaryDirectory
        let dir = root.appendingPathComponent("heraldlab-bench-arm-\(getpid())")
        defer { try? FileManager.default.removeItem(at: dir) }
        let token = LabToken.generate()
        let verbose = ProcessInfo.processInfo.environment["HERALDLAB_VERBOSE"] != nil
        let quiet = { (label: String) in verbose ? Logger(label: label) : Logger(label: label) { _ in SwiftLogNoOpLogHandler() } }
        let air = AirServer(logger: quiet("herald-lab.air"))
        let airPort = try air.start(port: 0)

        // The coordinator: the herald-lab beside this executable, as `herald-lab coordinator` (or
        // another build's, to compare: HERALDLAB_BENCH_COORDINATOR=path/to/herald-lab).
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let portFile = dir.appendingPathComponent("coordinator.port")
        let coordinator = Process()
        coordinator.executableURL = URL(fileURLWithPath: ProcessInfo.processInfo.environment["HERALDLAB_BENCH_COORDINATOR"] ?? Bench.heraldLab)
        coordinator.arguments = ["coordinator", "--results", dir.appendingPathComponent("results").path, "--air", "127.0.0.1:\(airPort)",
                                 "--port-file", portFile.path]
        var env = ProcessInfo.processInfo.environment
        env["HERALDLAB_TOKEN"] = token
        coordinator.environment = env
        coordinator.standardOutput = FileHandle.nullDevice
        if !verbose { coordinator.standardError = FileHandle.nullDevice }
        try coordinator.run()
        defer { coordinator.terminate() }
        var port: UInt16?
        for _ in 0..<200 where port == nil {
            port = (try? String(contentsOf: portFile, encoding: .utf8)).flatMap { UInt16($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
            if port == nil { try await Task.sleep(nanoseconds: 50_000_000) }
        }
        guard let port else { throw ValidationError("the coordinator did not start") }
        let base = URL(string: "http://127.0.0.1:\(port)")!
        let client = LabClient(base: base, token: token, timeout: 30)

        var list = [Agent]()
        let started = Date()
        for i in 1...agents {
            var c = Agent.Config(name: "a\(i)", dataDirectory: dir.appendingPathComponent("a\(i)"))
            c.token = token
            c.coordinator = base
            c.heartbeatInterval = heartbeat
            let a = Agent(config: c, logger: quiet("herald-lab.agent"))
            _ = try await a.start()
            list.append(a)
        }
        log(String(format: "%d agents listening in %.2f s", agents, Date().timeIntervalSince(started)))
        var alive = 0
        while alive < agents {
            try await Task.sleep(nanoseconds: 200_000_000)
            let views: [Coordinator.AgentView] = try await client.call(CoordinatorAPI.agents.method, CoordinatorAPI.agents.path())
            alive = views.filter { $0.state == .alive }.count
            if Date().timeIntervalSince(started) > 120 { throw ValidationError("only \(alive) of \(agents) agents alive after 120 s") }
        }
        log(String(format: "%d agents registered and heartbeating every %g s after %.2f s", agents, heartbeat, Date().timeIntervalSince(started)))
        // Let the heartbeats settle into their rhythm before the measurement.
        try await Task.sleep(nanoseconds: UInt64(max(settle, 2 * heartbeat) * 1e9))
        let columns = Int(Double(agents).squareRoot().rounded(.up))
        let plan = "name: arm\(agents)\nduration: 10s\nnodes: {count: \(agents), prefix: n, grid: {columns: \(columns), spacing: 2m}}\n"
        struct Run: Decodable {
            var id: String; var state: RunRecord.State; var message: String?
            struct Node: Decodable { var clockBefore: LabWire.ClockSample? }
            var nodes: [Node]?
        }
        var times = [Double]()
        for attempt in 1...max(1, repeats) {
            let t0 = Date()
            let cpu0 = (Bench.cpuSeconds(of: coordinator.processIdentifier), Bench.cpuSeconds(of: getpid()))
            let (status, body, _) = try await client.request(CoordinatorAPI.submit.method, CoordinatorAPI.submit.path(query: "name=bench"), body: Data(plan.utf8))
            guard status == 201, var run = try? LabJSON.decoder.decode(Run.self, from: body) else {
                throw ValidationError("submit refused: HTTP \(status) \(String(decoding: body.prefix(300), as: UTF8.self))")
            }
            while run.state == .arming {
                // Not more often: each answer encodes the whole run record (a thousand nodes).
                try await Task.sleep(nanoseconds: 50_000_000)
                run = try await client.call(CoordinatorAPI.run.method, CoordinatorAPI.run.path(run.id))
            }
            let armed = Date().timeIntervalSince(t0)
            let cpu1 = (Bench.cpuSeconds(of: coordinator.processIdentifier), Bench.cpuSeconds(of: getpid()))
            times.append(armed)
            let rss = Bench.memory(of: coordinator.processIdentifier)
            log(String(format: "arm %d agents (clock, assignment, start instant to each): %.3f s (target <= 3 s); state %@; coordinator RSS %.0f MB, peak %.0f MB (target < 300 MB)",
                       agents, armed, run.state.rawValue, rss.current, rss.peak) + (run.state == .running ? "" : ": \(run.message ?? "")"))
            log(String(format: "  CPU while arming: coordinator %.2f s, agents' process %.2f s", cpu1.0 - cpu0.0, cpu1.1 - cpu0.1))
            // Each node's clock: from its heartbeats when they bound it to ± 1 ms, else probed
            // (the probes stop early once a round trip within 1 ms was seen).
            let clocks = (run.nodes ?? []).compactMap(\.clockBefore)
            let trips = clocks.map(\.roundTrip).sorted()
            if !trips.isEmpty {
                let at = { (q: Double) in trips[min(trips.count - 1, Int(q * Double(trips.count)))] * 1000 }
                log(String(format: "  clocks: %d from heartbeats, %d probed; round trip (offset bound x2) per node: median %.2f ms, 90th percentile %.2f ms, worst %.2f ms; %d of %d within 1 ms",
                           clocks.filter { $0.from == .heartbeats }.count, clocks.filter { $0.from == .probes }.count,
                           at(0.5), at(0.9), trips.last! * 1000, trips.filter { $0 <= 0.001 }.count, trips.count))
            }
            if attempt < repeats {
                // End the run at once so that the agents are free for the next.
                _ = try? await client.request(CoordinatorAPI.abort.method, CoordinatorAPI.abort.path(run.id))
                var state = run.state
                for _ in 0..<600 where !state.isFinal {
                    try await Task.sleep(nanoseconds: 100_000_000)
                    state = (try? await client.call(CoordinatorAPI.run.method, CoordinatorAPI.run.path(run.id), as: Run.self))?.state ?? state
                }
                try await Task.sleep(nanoseconds: 1_000_000_000)
            }
        }
        if times.count > 1 { log(String(format: "arm %d agents: median %.3f s of %d", agents, times.sorted()[times.count / 2], times.count)) }
        // Tearing down the in-process agents is not part of the measurement: leave at once.
        coordinator.terminate()
        coordinator.waitUntilExit()
        withExtendedLifetime((list, air)) {}
        // exit() skips the `defer` above: the agents' folders (in /dev/shm, memory) go first;
        // twice, since agents still answering the last starts may write into them meanwhile.
        try? FileManager.default.removeItem(at: dir)
        try await Task.sleep(nanoseconds: 500_000_000)
        try? FileManager.default.removeItem(at: dir)
        Glibc.exit(0)
    }
}

enum Bench {
    /// The herald-lab built beside this executable (the same build folder), to start its
    /// coordinator as a process of its own.
    static var heraldLab: String {
        let me = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        return URL(fileURLWithPath: me).deletingLastPathComponent().appendingPathComponent("herald-lab").path
    }

    /// Raises the open-file limit to the hard limit: every in-process agent holds a listening
    /// socket, and connections come and go for each heartbeat.
    static func raiseFileLimit() {
        var l = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &l) == 0 else { return }
        if l.rlim_cur < l.rlim_max {
            l.rlim_cur = l.rlim_max
            _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &l)
        }
    }

    /// CPU time (user + system) a process has used, in seconds, from /proc.
    static func cpuSeconds(of pid: Int32) -> Double {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = text.lastIndex(of: ")") else { return 0 }
        let fields = text[text.index(after: close)...].split(separator: " ")
        // After the command: state is field 3; utime and stime are fields 14 and 15.
        guard fields.count > 13, let u = Double(fields[11]), let s = Double(fields[12]) else { return 0 }
        return (u + s) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// Resident memory of a process, now and at its peak (MB), from /proc.
    static func memory(of pid: Int32) -> (current: Double, peak: Double) {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return (0, 0) }
        func field(_ name: String) -> Double {
            for line in text.split(separator: "\n") where line.hasPrefix(name + ":") {
                return Double(line.split(separator: " ").dropFirst().first.map(String.init) ?? "") .map { $0 / 1024 } ?? 0
            }
            return 0
        }
        return (field("VmRSS"), field("VmHWM"))
    }
}
