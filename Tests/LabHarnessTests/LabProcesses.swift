import Foundation
import XCTest
import LabHTTP
import LabPlan
import HeraldCore
#if canImport(Glibc)
import Glibc
#endif

/// Starts real `herald-lab` processes on loopback (air, coordinator, agents) and cleans them up.
final class LabProcesses {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    static let binary = root.appendingPathComponent(".build/debug/herald-lab")

    let dir: URL
    let token = LabToken.generate()
    let tokenFile: URL
    var processes: [String: Process] = [:]
    var ports: [String: UInt16] = [:]
    var results: URL { dir.appendingPathComponent("results") }

    init() throws {
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("lab-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        tokenFile = dir.appendingPathComponent("token")
        try token.write(to: tokenFile, atomically: true, encoding: .utf8)
    }

    deinit { stopAll() }

    func stopAll() {
        for p in processes.values where p.isRunning { kill(p.processIdentifier, SIGTERM) }
        let deadline = Date().addingTimeInterval(5)
        for p in processes.values { while p.isRunning && Date() < deadline { usleep(20_000) } }
        for p in processes.values where p.isRunning { kill(p.processIdentifier, SIGKILL); p.waitUntilExit() }
        processes.removeAll()
        try? FileManager.default.removeItem(at: dir)
    }

    /// Starts `herald-lab ARGS --port-file ...` as `name`; waits until it listens; returns its port.
    @discardableResult
    func start(_ name: String, _ args: [String], port: UInt16 = 0) throws -> UInt16 {
        let portFile = dir.appendingPathComponent("\(name).port")
        try? FileManager.default.removeItem(at: portFile)
        let p = Process()
        p.executableURL = Self.binary
        p.arguments = args + ["--port", String(port), "--port-file", portFile.path]
        let log = dir.appendingPathComponent("\(name).log")
        if !FileManager.default.fileExists(atPath: log.path) { FileManager.default.createFile(atPath: log.path, contents: nil) }
        let handle = try FileHandle(forWritingTo: log)
        handle.seekToEndOfFile()
        p.standardOutput = handle
        p.standardError = handle
        try p.run()
        processes[name] = p
        let deadline = Date().addingTimeInterval(20)
        while Date() < deadline {
            if let text = try? String(contentsOf: portFile, encoding: .utf8), let port = UInt16(text.trimmingCharacters(in: .whitespacesAndNewlines)) {
                ports[name] = port
                return port
            }
            guard p.isRunning else { break }
            usleep(50_000)
        }
        throw NSError(domain: "lab", code: 1, userInfo: [NSLocalizedDescriptionKey: "\(name) did not start: \(self.log(name))"])
    }

    func log(_ name: String) -> String { (try? String(contentsOf: dir.appendingPathComponent("\(name).log"), encoding: .utf8)) ?? "" }

    func kill9(_ name: String) {
        guard let p = processes[name] else { return }
        kill(p.processIdentifier, SIGKILL)
        p.waitUntilExit()
    }

    var coordinatorURL: String { "http://127.0.0.1:\(ports["coordinator"]!)" }
    var airAddress: String { "127.0.0.1:\(ports["air"]!)" }

    func startAir() throws { try start("air", ["air", "--token-file", tokenFile.path]) }

    func startCoordinator(port: UInt16 = 0) throws {
        try start("coordinator", ["coordinator", "--token-file", tokenFile.path, "--results", results.path, "--air", airAddress, "--gather-patience", "30s"], port: port)
    }

    func startAgent(_ i: Int, port: UInt16 = 0) throws {
        try start("agent\(i)", ["agent", "--name", "agent\(i)", "--token-file", tokenFile.path, "--data", dir.appendingPathComponent("agent\(i)").path,
                                "--coordinator", coordinatorURL, "--air", airAddress], port: port)
    }

    /// A lab with the air, a coordinator and `agents` agents, all registered.
    static func make(agents: Int) throws -> LabProcesses {
        guard FileManager.default.isExecutableFile(atPath: binary.path) else { throw XCTSkip("build herald-lab first (make test builds it)") }
        let lab = try LabProcesses()
        try lab.startAir()
        try lab.startCoordinator()
        for i in 1...agents { try lab.startAgent(i) }
        try lab.waitUntil(timeout: 20, "agents registered") { (try? lab.aliveAgents()) == agents }
        return lab
    }

    /// A plan of `nodes` nodes 1 m apart on a line.
    static func plan(_ name: String, nodes: Int, duration: String) -> String {
        var text = "name: \(name)\nduration: \(duration)\nwarmup: 2s\nnodes:\n"
        for i in 0..<nodes { text += "  - {name: n\(i + 1), position: [\(i), 0]}\n" }
        return text
    }

    var client: LabClient { LabClient(base: URL(string: coordinatorURL)!, token: token, timeout: 5) }

    func aliveAgents() throws -> Int {
        let sem = DispatchSemaphore(value: 0)
        let box = ResultBox<Int>()
        let c = client
        Task {
            defer { sem.signal() }
            guard let (status, data, _) = try? await c.request("GET", "/v1/agents"), status == 200,
                  let list = try? JSONSerialization.jsonObject(with: data) as? [[String: Any]] else { return }
            box.value = list.filter { $0["state"] as? String == "alive" }.count
        }
        sem.wait()
        return box.value ?? 0
    }

    /// Calls the coordinator synchronously.
    func call(_ method: String, _ path: String, body: Data? = nil, token: String?? = nil) -> (Int, Data) {
        let sem = DispatchSemaphore(value: 0)
        let box = ResultBox<(Int, Data)>()
        let c = LabClient(base: URL(string: coordinatorURL)!, token: token ?? self.token, timeout: 10)
        Task {
            defer { sem.signal() }
            if let (s, d, _) = try? await c.request(method, path, body: body) { box.value = (s, d) }
        }
        sem.wait()
        return box.value ?? (0, Data())
    }

    /// A dashboard page as the operator's browser gets it: signed in with the operator's token.
    func dashboard(_ path: String) -> (Int, String) {
        let sem = DispatchSemaphore(value: 0)
        let box = ResultBox<(Int, String)>()
        let c = LabClient(base: URL(string: coordinatorURL)!, token: nil, timeout: 120)
        let form = "credential=" + (token.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? "")
        Task {
            defer { sem.signal() }
            guard let (_, _, h) = try? await c.request("POST", "/signin", body: Data(form.utf8), headers: ["Content-Type": "application/x-www-form-urlencoded"]),
                  let cookie = h["set-cookie"]?.split(separator: ";").first else { return }
            if let (s, d, _) = try? await c.request("GET", path, headers: ["Cookie": String(cookie)]) { box.value = (s, String(decoding: d, as: UTF8.self)) }
        }
        sem.wait()
        return box.value ?? (0, "")
    }

    func runRecord(_ id: String) -> [String: Any]? {
        let (s, d) = call("GET", "/v1/runs/\(id)")
        guard s == 200 else { return nil }
        return try? JSONSerialization.jsonObject(with: d) as? [String: Any]
    }

    func submit(_ plan: String) throws -> String {
        let (s, d) = call("POST", "/v1/runs", body: Data(plan.utf8))
        guard s == 201, let obj = try? JSONSerialization.jsonObject(with: d) as? [String: Any], let id = obj["id"] as? String else {
            throw NSError(domain: "lab", code: s, userInfo: [NSLocalizedDescriptionKey: String(decoding: d, as: UTF8.self)])
        }
        return id
    }

    func waitUntil(timeout: TimeInterval, _ what: String, _ condition: () -> Bool) throws {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if condition() { return }
            usleep(100_000)
        }
        throw NSError(domain: "lab", code: 2, userInfo: [NSLocalizedDescriptionKey: "timed out waiting for \(what)\ncoordinator log:\n\(log("coordinator").suffix(3000))"])
    }

    /// Rows (after the header) of every contacts.csv under `folder`, as the agent has written them.
    static func contactRows(under folder: URL) -> Int {
        guard let files = FileManager.default.enumerator(at: folder, includingPropertiesForKeys: nil) else { return 0 }
        var rows = 0
        for case let url as URL in files where url.lastPathComponent == "contacts.csv" {
            guard let data = FileManager.default.contents(atPath: url.path) else { continue }
            rows += max(0, data.reduce(0) { $0 + ($1 == UInt8(ascii: "\n") ? 1 : 0) } - 1)
        }
        return rows
    }

    /// Waits until the node of `run` that `agent` runs has logged more than `rows` contacts on
    /// the agent's disk: the condition a fault test needs before it strikes ("the sensors are
    /// writing"), instead of a fixed sleep whose length depends on the machine's load.
    func waitForContacts(_ agent: String, run: String, moreThan rows: Int, timeout: TimeInterval = 30) throws {
        let folder = dir.appendingPathComponent("\(agent)/runs/\(run)")
        try waitUntil(timeout: timeout, "\(agent) logged more than \(rows) contacts in run \(run)") { Self.contactRows(under: folder) > rows }
    }

    /// Waits until the node of `run` that `agent` runs has logged contacts for at least
    /// `seconds` (its first row is that old): a test that compares the rate before a fault with
    /// the rate after it needs a whole window of rows before the fault.
    func waitForContacts(_ agent: String, run: String, spanning seconds: TimeInterval, timeout: TimeInterval = 30) throws {
        let folder = dir.appendingPathComponent("\(agent)/runs/\(run)")
        try waitUntil(timeout: timeout, "\(agent) logged contacts for \(seconds) s in run \(run)") {
            guard let first = Self.firstContactTime(under: folder) else { return false }
            return Date().timeIntervalSince(first) >= seconds
        }
    }

    /// The time of the first row of the first contacts.csv under `folder`.
    static func firstContactTime(under folder: URL) -> Date? {
        guard let files = FileManager.default.enumerator(at: folder, includingPropertiesForKeys: nil) else { return nil }
        for case let url as URL in files where url.lastPathComponent == "contacts.csv" {
            guard let text = try? String(contentsOf: url, encoding: .utf8) else { continue }
            let lines = text.split(separator: "\n")
            if lines.count > 1, let t = HeraldTimestamp.parse(String(lines[1].prefix(28))) { return t }
        }
        return nil
    }

    /// The agent that runs `node` in run `id` (from the coordinator's record).
    func agent(of node: String, in id: String) -> String? {
        ((runRecord(id)?["nodes"] as? [[String: Any]]) ?? []).first { $0["name"] as? String == node }?["agent"] as? String
    }

    /// Runs `herald-lab ARGS` to completion.
    /// `timeout`: the command is stopped (SIGTERM) after that many seconds (for services).
    func cli(_ args: [String], environment: [String: String]? = nil, timeout: TimeInterval? = nil) throws -> (Int32, String) {
        let p = Process()
        p.executableURL = Self.binary
        p.arguments = args
        if let environment { p.environment = environment }
        if let timeout { DispatchQueue.global().asyncAfter(deadline: .now() + timeout) { if p.isRunning { p.terminate() } } }
        let pipe = Pipe()
        p.standardOutput = pipe
        p.standardError = pipe
        try p.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return (p.terminationStatus, String(decoding: data, as: UTF8.self))
    }
}

final class ResultBox<T>: @unchecked Sendable { var value: T? }
