import ArgumentParser
import Foundation
import HeraldCore
import LabAgent
import LabCoordinator
import LabHTTP
import LabNet
import LabPlan
import LabResults
import RadioAir
import RadioSim
import Logging
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Options every lab service shares.
struct ServiceOptions: ParsableArguments {
    @Option(help: "Address to listen on.")
    var host: String = "127.0.0.1"

    @Option(help: "Port to listen on (0: any free port; the port is printed).")
    var port: UInt16 = 0

    @Option(name: .customLong("token-file"), help: "File holding the lab's shared token (default: $HERALDLAB_TOKEN).")
    var tokenFile: String?

    @Option(help: "Credentials folder (default: $HERALDLAB_CREDENTIALS): cert.pem and key.pem serve TLS, ca.pem checks the lab's other services; see herald-lab ca init and herald-lab enrol.")
    var credentials: String?

    @Option(name: .customLong("port-file"), help: "Write the bound port to this file once listening.")
    var portFile: String?

    @Flag(help: "Run without a token (authentication off); only on a loopback address.")
    var insecure = false

    @Option(name: .customLong("scrape-token-file"), help: "File holding the scrape credential, which reads GET /metrics and nothing else (default: scrape.token in the credentials folder, if there is one).")
    var scrapeTokenFile: String?

    @Option(name: .customLong("log-level"), help: "The least level logged on stderr: trace, debug, info, notice, warning, error or critical (default: info).",
            transform: Flags.logLevel)
    var logLevel: Logger.Level = .info

    /// The service's logger for `label` at --log-level (one line per event on stderr: LabLogHandler,
    /// bootstrapped when herald-lab starts).
    func logger(_ label: String) -> Logger {
        var logger = Logger(label: label)
        logger.logLevel = logLevel
        return logger
    }

    /// The scrape credential, if any: --scrape-token-file, else the credentials folder's
    /// scrape.token; never $HERALDLAB_TOKEN (the lab's shared token), and never equal to
    /// `others` (the operator's or the lab's credential, which it would otherwise shadow).
    func scrapeToken(_ folder: CredentialsFolder?, others: [String?]) throws -> String? {
        let token: String?
        do {
            if let scrapeTokenFile { token = try LabToken.load(file: scrapeTokenFile) } else { token = try folder?.secret("scrape.token") }
        } catch {
            log("\(error)")
            throw ExitCode(2)
        }
        if let token, others.contains(token) {
            log("the scrape credential is the same as the operator's or the lab's token: give the scrape credential a token of its own (herald-lab ca init writes scrape.token)")
            throw ExitCode(2)
        }
        return token
    }

    /// The credentials folder, if any; its lab CA is trusted for every connection this process
    /// makes, and its certificate is what the service serves TLS with.
    func folder() throws -> (folder: CredentialsFolder?, tls: TLSContext?) {
        do {
            let folder = try CredentialsFolder.locate(credentials)
            try folder?.trustLabCA()
            return (folder, try folder?.serverTLS())
        } catch {
            log("\(error)")
            throw ExitCode(2)
        }
    }

    /// The shared token (--token-file, $HERALDLAB_TOKEN, else `fallback` from the credentials
    /// folder). A service with no credential at all (`hasOther` false) refuses to start unless
    /// told --insecure, and then listens on loopback only: authentication is never off by accident.
    func token(fallback: () throws -> String? = { nil }, hasOther: Bool = false) throws -> String? {
        let token: String?
        do { token = try LabToken.load(file: tokenFile) ?? fallback() } catch {
            log("\(error)")
            throw ExitCode(2)
        }
        if insecure && (token != nil || hasOther) {
            log("--insecure turns authentication off: give it without --token-file, $HERALDLAB_TOKEN or credentials")
            throw ExitCode(2)
        }
        if token == nil && !hasOther {
            guard insecure else {
                log("no credentials: give --credentials DIR (herald-lab ca init, herald-lab enrol), --token-file FILE or HERALDLAB_TOKEN (herald-lab services never run without authentication unless told --insecure, on loopback only)")
                throw ExitCode(2)
            }
            let bound = try bindHost()
            log("warning: authentication is off (--insecure); listening on \(bound) only")
        }
        return token
    }

    /// The host to listen on: --host as given, except with --insecure, where it is resolved and
    /// must be loopback only, and the numeric address checked is what is bound (the host's text
    /// decides nothing: `127.attacker.example` is a name like any other).
    func bindHost() throws -> String {
        guard insecure else { return host }
        do { return try Listener.loopbackAddress(host: host) } catch {
            log("--insecure runs without authentication and so listens on loopback only: --host \(host): \(error)")
            throw ExitCode(2)
        }
    }

    func announce(_ port: UInt16, _ what: String) { announcer(what)(port) }

    /// `announce` for `what`, as a closure a server calls once it listens.
    func announcer(_ what: String) -> @Sendable (UInt16) -> Void {
        let host = host, portFile = portFile
        return { port in
            print("\(what) listening on \(HostPort(host: host, port: port))")
            fflush(nil)
            if let portFile { try? "\(port)\n".write(toFile: portFile, atomically: true, encoding: .utf8) }
        }
    }
}

/// `--air HOST:PORT` (a name, an IPv4 address, or [IPv6]:PORT), or exit 2 naming the problem.
func parseAir(_ text: String) throws -> LabWire.AirAddress {
    do {
        let a = try HostPort(parsing: text)
        return LabWire.AirAddress(host: a.host, port: a.port)
    } catch { log("--air: \(error)"); throw ExitCode(2) }
}

/// Blocks until SIGINT or SIGTERM, or until `timeout` seconds have passed. Returns true for a signal.
@discardableResult
func waitForTermination(timeout: TimeInterval? = nil) async -> Bool {
    signal(SIGINT, SIG_IGN)
    signal(SIGTERM, SIG_IGN)
    let wait = TerminationWait()
    await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
        wait.begin(c)
        let queue = DispatchQueue(label: "heraldlab.signals")
        let sources = [SIGINT, SIGTERM].map { DispatchSource.makeSignalSource(signal: $0, queue: queue) }
        for s in sources {
            // The handler holds its own source: a source stops once freed, and these are kept
            // for the life of the process.
            s.setEventHandler { withExtendedLifetime(s) { wait.end(signal: true) } }
            s.resume()
        }
        if let timeout { queue.asyncAfter(deadline: .now() + timeout) { wait.end(signal: false) } }
    }
    return wait.signalled
}

/// A signal or the timeout, whichever comes first: the waiter is resumed once, and whether a
/// signal came is kept.
final class TerminationWait: Sendable {
    private struct State {
        var waiter: CheckedContinuation<Void, Never>?
        var signalled = false
    }
    private let state = Mutex(State())
    func begin(_ c: CheckedContinuation<Void, Never>) { state.withLock { $0.waiter = c } }
    func end(signal: Bool) {
        let waiter = state.withLock { s -> CheckedContinuation<Void, Never>? in
            if signal { s.signalled = true }
            defer { s.waiter = nil }
            return s.waiter
        }
        waiter?.resume()
    }
    var signalled: Bool { state.withLock { $0.signalled } }
}


struct AirCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "air", abstract: "The simulated radio medium as a service, for agents with radio sim (real time, loopback).")

    @OptionGroup var service: ServiceOptions

    @Option(help: "Seed of the medium's random generator.")
    var seed: UInt64 = 1

    func run() async throws {
        let (folder, tls) = try service.folder()
        let ticketKey: Data?
        do { ticketKey = try folder?.secret("air.key").map { Data($0.utf8) } } catch { log("\(error)"); throw ExitCode(2) }
        let token = try service.token(fallback: { try folder?.secret("operator.token") }, hasOther: ticketKey != nil)
        let air = AirServer(parameters: RadioParameters(), seed: seed, token: token, ticketKey: ticketKey, logger: service.logger("herald-lab.air"))
        let host = try service.bindHost()
        let port: UInt16
        do { port = try air.start(host: host, port: service.port, tls: tls) } catch {
            log("herald-lab air: \(error)")
            throw ExitCode(1)
        }
        service.announce(port, "air")
        try await runService("air") { air.stop() }
    }
}

struct AgentCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "agent", abstract: "Run one node of a plan on this machine, for a coordinator.")

    @OptionGroup var service: ServiceOptions

    @Option(help: "Agent name (letters, digits, -, _, .).")
    var name: String

    @Option(help: "Data directory: assignments and logs are kept here until gathered.")
    var data: String

    @Option(help: "Coordinator URL to register with, e.g. http://127.0.0.1:8700.")
    var coordinator: String?

    @Option(help: "Comma-separated tags for plan selection.")
    var tags: String = ""

    @Option(help: "Radio: sim (attach to the air) or bluez.")
    var radio: String = "sim"

    @Option(help: "BlueZ adapter (bluez radio): its address (stable across reboots and re-plugging) or hciN.")
    var adapter: String?

    @Option(name: .customLong("dongle-name"), help: "The dongle's label, as plans select it (bluez radio; default: the agent's name).")
    var dongleName: String?

    @Option(name: .customLong("host-name"), help: "The host the dongle is reported on (default: this machine's name).")
    var hostName: String?

    @Option(help: "Where sysfs is (the dongle's USB identity, USB resets).")
    var sysfs: String = "/sys"

    @Flag(name: .customLong("no-usb-reset"), help: "Never reset the dongle at USB level when it stops answering (a power-cycle through bluetoothd is still tried).")
    var noUSBReset = false

    @Option(help: "The air to attach to (HOST:PORT) when the coordinator names none.")
    var air: String?

    @Option(name: .customLong("advertise-url"), help: "URL the coordinator should call this agent at (default: the address its registration comes from when --host is a wildcard, else http://HOST:PORT).")
    var advertiseURL: String?

    func run() async throws {
        guard SafeName.isValid(name) else { log("--name \"\(name)\" \(SafeName.problem(with: name)!)"); throw ExitCode(2) }
        guard let radioKind = RadioKind(rawValue: radio) else { log("--radio \"\(OutsideText.escaped(String(radio.prefix(32))))\": must be sim or bluez\(CLIConventions.didYouMean(radio, among: ["sim", "bluez"]))"); throw ExitCode(2) }
        var config = Agent.Config(name: name, dataDirectory: URL(fileURLWithPath: data))
        config.host = try service.bindHost()
        config.port = service.port
        let (folder, tls) = try service.folder()
        do { config.credential = try folder?.agent() } catch { log("\(error)"); throw ExitCode(2) }
        if let c = config.credential, c.name != name {
            log("--name \(name): this host's enrolment (agent.json) is for agent \(c.name)")
            throw ExitCode(2)
        }
        config.token = try service.token(hasOther: config.credential != nil)
        config.scrapeToken = try service.scrapeToken(folder, others: [config.token, config.credential?.token, config.credential?.coordinatorToken])
        config.tls = tls
        config.insecure = service.insecure
        if let coordinator {
            guard let u = URL(string: coordinator), u.scheme == "http" || u.scheme == "https", u.host != nil else { log("--coordinator \"\(coordinator)\": expected a URL such as http://coord.lab:8700"); throw ExitCode(2) }
            config.coordinator = u
        }
        if let advertiseURL {
            guard let u = URL(string: advertiseURL), u.scheme == "http" || u.scheme == "https", let h = u.host, !h.isEmpty, u.port != nil else {
                log("--advertise-url \"\(advertiseURL)\": expected a URL with host and port, such as http://n1.lab:8701"); throw ExitCode(2)
            }
            config.advertiseURL = u
        }
        config.tags = tags.split(separator: ",").map(String.init).filter { $0 != "none" }
        config.radio = radioKind
        config.adapter = adapter
        if let dongleName {
            guard SafeName.isValid(dongleName) else { log("--dongle-name \"\(dongleName)\" \(SafeName.problem(with: dongleName)!)"); throw ExitCode(2) }
            config.dongleName = dongleName
        }
        config.sysfsRoot = sysfs
        if let hostName {
            guard SafeName.isValid(hostName) else { log("--host-name \"\(hostName)\" \(SafeName.problem(with: hostName)!)"); throw ExitCode(2) }
            config.hostName = hostName
        }
        config.usbReset = !noUSBReset
        if let air { config.air = try parseAir(air) }
        let agent = Agent(config: config, logger: service.logger("herald-lab.agent"))
        // Its HTTP server and background services run in the process's one ServiceGroup; the
        // agent starts once it listens, and its heartbeats then.
        let announce = service.announcer("agent \(name)")
        let background = agent.services.map { s in BackgroundService(name: s.name, work: s.run) }
        do {
            let server = try agent.server { announce($0) }
            try await runService("agent", server: server, background: background) { await agent.stop() }
        } catch let e as ServiceError {
            log("herald-lab agent: \(e)")
            throw ExitCode(2)
        }
    }
}

struct CoordinatorCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "coordinator", abstract: "Distribute plans to agents, start them together, gather their logs into bundles.")

    @OptionGroup var service: ServiceOptions

    @Option(help: "Results folder (bundles, coordinator.sqlite, history.sqlite).")
    var results: String = "results"

    @Option(help: "Inventory of expected agents (YAML).")
    var inventory: String?

    @Option(help: "The air agents with radio sim attach to (HOST:PORT).")
    var air: String?

    @Option(name: .customLong("gather-patience"), help: "How long gathering keeps retrying an unreachable agent, 1s to 1d (default: 1m).", transform: Flags.duration(min: 1, max: 86_400))
    var gatherPatience: TimeInterval = 60

    @Option(help: "Delete the bundles of ended runs older than this, such as 30d (1h to 36500d; default: keep them).", transform: Flags.duration(min: 3600, max: 36_500 * 86_400))
    var retain: TimeInterval?

    @Option(name: .customLong("retain-days"), help: .hidden)
    var retainDays: String?

    @Option(name: .customLong("quarantine-after"), help: "Quarantine a dongle after this many failed checks, or outlier runs, in a row.")
    var quarantineAfter: Int = 2

    @Option(name: .customLong("preflight"), help: "The longest a run's pre-flight check of its dongles may take when its plan says none (30s; off: no check).")
    var preflight: String = "30s"

    @Option(name: .customLong("health-check-every"), help: "Health-check every free dongle this often (e.g. 24h; default: only on demand, herald-lab dongles check).")
    var healthCheckEvery: String?

    @OptionGroup var shared: SharedHistoryOptions

    func run() async throws {
        var config = Coordinator.Config(results: URL(fileURLWithPath: results))
        let writer = try await shared.writer(results: config.results, logger: service.logger("herald-lab.results"))
        if let writer {
            config.recordRun = { r, bundle in try writer.record(r, bundle: bundle) }
            config.recordStudy = { s in try writer.record(try SharedHistoryOptions.sharedStudy(s, lab: writer.lab)) }
        }
        config.lab = try writer?.lab ?? shared.labName()
        // The Trends pages read every lab's runs from the shared store, on a connection of their own.
        let reader = try shared.dashboardReader(logger: service.logger("herald-lab.results"))
        config.historyReader = reader
        config.host = try service.bindHost()
        config.port = service.port
        let (folder, tls) = try service.folder()
        config.credentials = folder
        config.tls = tls
        do { config.airKey = try folder?.secret("air.key").map { Data($0.utf8) } } catch { log("\(error)"); throw ExitCode(2) }
        config.token = try service.token(fallback: { try folder?.secret("operator.token") })
        config.scrapeToken = try service.scrapeToken(folder, others: [config.token])
        config.insecure = service.insecure
        config.inventory = inventory.map { URL(fileURLWithPath: $0) }
        config.gatherPatience = gatherPatience
        if retainDays != nil { log("herald-lab coordinator: --retain-days is now --retain, which takes a duration with its unit, such as --retain 30d"); throw ExitCode(2) }
        config.retainDays = retain.map { $0 / 86_400 }
        if let air { config.air = try parseAir(air) }
        guard (1...1000).contains(quarantineAfter) else { log("--quarantine-after must be between 1 and 1000"); throw ExitCode(2) }
        config.quarantineAfter = quarantineAfter
        if preflight == "off" { config.preflightBound = 0 } else {
            guard let d = Plan.parseDuration(preflight), d >= 1, d <= 600 else { log("--preflight \"\(preflight)\": a duration from 1s to 10m, or off"); throw ExitCode(2) }
            config.preflightBound = d
        }
        if let healthCheckEvery {
            guard let d = Plan.parseDuration(healthCheckEvery), d >= 60 else { log("--health-check-every \"\(healthCheckEvery)\": a duration of at least 1m, such as 24h"); throw ExitCode(2) }
            config.healthCheckEvery = d
        }
        let coordinator: Coordinator
        do { coordinator = try Coordinator(config: config, logger: service.logger("herald-lab.coordinator")) } catch {
            log("herald-lab coordinator: \(error)")
            throw ExitCode(2)
        }
        // Its HTTP server and background services (the run driver first) run in the process's one ServiceGroup.
        var background = coordinator.services.map { s in BackgroundService(name: s.name, work: s.run) }
        if let w = writer { background.append(BackgroundService(name: "shared history") { await w.run(retryEvery: 60) }) }
        let announce = service.announcer("coordinator")
        do {
            let server = try coordinator.server { announce($0) }
            try await runService("coordinator", server: server, background: background) { await coordinator.stop() }
        } catch let e as ServiceError {
            log("herald-lab coordinator: \(e)")
            throw ExitCode(2)
        }
        await writer?.store.close()
        await reader?.close()
    }
}
