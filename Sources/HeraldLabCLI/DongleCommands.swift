import ArgumentParser
import BlueZRadio
import Foundation
import HeraldCore
import LabAgent
import LabHTTP
import LabNet
import LabNode
import LabPlan

/// `herald-lab dongles`: this host's dongles (sysfs, the kernel, bluetoothd, HCI), or with
/// --coordinator the whole lab's with their health and history; a health check on demand;
/// quarantine, release, maintenance and retirement of one.
struct DonglesCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dongles",
        abstract: "List this host's dongles, or (--coordinator) the lab's with health and history; check, quarantine, release, maintain or retire one.",
        subcommands: [DonglesList.self, DonglesCheck.self, DonglesQuarantine.self, DonglesRelease.self, DonglesMaintenance.self, DonglesRetire.self],
        defaultSubcommand: DonglesList.self)
}

struct DonglesList: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "list", abstract: "Every dongle: adapter, address, make, HCI/LMP version, USB identity and port, driver, firmware; with --coordinator also host, health and history.")

    @Option(help: "Coordinator URL: list the whole lab's dongles with their health and history (default: this host's).")
    var coordinator: String?

    @Option(name: .customLong("token-file"), help: "File holding the token (default: $HERALDLAB_TOKEN, else operator.token in the credentials folder).")
    var tokenFile: String?

    @Option(help: "Credentials folder (default: $HERALDLAB_CREDENTIALS).")
    var credentials: String?

    @Option(help: "History entries to show per dongle (coordinator).")
    var history: Int = 5

    @Option(help: "Where sysfs is (this host).")
    var sysfs: String = "/sys"

    @Option(help: ArgumentHelp("JSON to FILE (--json alone or --json -: standard output, instead of the list).", valueName: "FILE"))
    var json: String?

    @Option(help: "Print a dongles.conf for agents/install.sh instead, naming each dongle PREFIX and its USB port path (this host).")
    var conf: String?

    func run() async throws {
        guard (0...1000).contains(history) else { log("--history must be between 0 and 1000"); throw ExitCode(2) }
        if let coordinator {
            let client = try coordinatorClient(coordinator, tokenFile: tokenFile, credentials: credentials)
            let views: [LabWire.DongleView]
            do { views = try await client.call(CoordinatorAPI.dongles.method, CoordinatorAPI.dongles.path(query: "history=\(history)")) } catch {
                log("herald-lab dongles: GET \(coordinator)/v1/dongles: \(error)"); throw ExitCode(2)
            }
            if let json {
                try CLIConventions.writeJSON(try LabJSON.encoder.encode(views), to: json, command: "dongles")
                if json == "-" { return }
            }
            if views.isEmpty { print("no dongles: no agent with radio bluez has registered"); return }
            for v in views { print(Self.describe(v)) }
            return
        }
        let survey = await LocalDongles.survey(sysfsRoot: sysfs)
        let host = hostName()
        let infos = survey.dongles.map { d in
            Agent.dongleInfo(d, selector: d.address ?? d.adapter, name: d.adapter, host: host, agent: nil, tags: [], identity: d.identity)
        }
        if let prefix = conf {
            guard SafeName.isValid(prefix + "x") else { log("--conf \"\(prefix)\": a name prefix of letters, digits, '-', '_' and '.'"); throw ExitCode(2) }
            print("# name  address  tags   (agents/install.sh --dongles FILE; one agent per dongle, port 8701 upwards)")
            for d in infos {
                guard let address = d.id else { print("# \(d.adapter ?? "?"): address unknown (\(d.problem ?? "bluetoothd down?")); not listed"); continue }
                let name = prefix + (d.usb?.port ?? d.adapter ?? "x")
                let tags = [d.manufacturerName.map { Self.tag($0) }, d.usb.map { "usb-\($0.vendor)-\($0.product)" }].compactMap { $0 }
                print("\(name) \(address) \(tags.isEmpty ? "none" : tags.joined(separator: ","))")
            }
            return
        }
        if let json {
            try CLIConventions.writeJSON(try LabJSON.encoder.encode(infos), to: json, command: "dongles")
            if json == "-" { return }
        }
        if infos.isEmpty { print("no Bluetooth controllers on this host") }
        for d in infos { print(Self.describe(d)) }
        for p in survey.problems { print("note: \(p)") }
        if !infos.isEmpty, let kernel = HostSystem.kernelRelease(), let problem = HostSystem.bluetoothProblem(kernelRelease: kernel) {
            print("note: \(problem)")
        }
    }

    /// A tag from a maker's name: its first word, lower case.
    static func tag(_ name: String) -> String {
        String(name.lowercased().prefix { $0.isLetter || $0.isNumber })
    }

    static func when(_ t: Double) -> String { HeraldTimestamp.utcSeconds(Date(timeIntervalSince1970: t)) }

    /// A dongle's identity lines.
    static func identity(_ d: LabWire.DongleInfo) -> [String] {
        var lines = [String]()
        var controller = [String]()
        if let m = d.manufacturer { controller.append("\(d.manufacturerName ?? "company") (\(m))") }
        if let h = d.hciVersion { controller.append("HCI \(ControllerIdentity.coreSpecification(h).map { $0.replacingOccurrences(of: "Bluetooth ", with: "") } ?? "?") (\(h)) rev \(d.hciRevision.map(String.init) ?? "?")") }
        if let f = d.firmwareText { controller.append(f) }
        if !controller.isEmpty { lines.append(controller.joined(separator: ", ")) }
        var hw = [String]()
        if let u = d.usb {
            var usb = "USB \(u.vendor):\(u.product) port \(u.port)"
            if let r = u.release { usb += " release \(r)" }
            if let s = u.serial { usb += " serial \(s)" }
            if let p = u.productString { usb += " \"\(p)\"" }
            hw.append(usb)
        } else if let b = d.bus { hw.append("bus \(b)") }
        if let dr = d.driver { hw.append("driver \(dr)\(d.driverVersion.map { " \($0)" } ?? "")") }
        if let h = d.hardware { hw.append("hardware \(h)") }
        if !hw.isEmpty { lines.append(hw.joined(separator: ", ")) }
        if let p = d.problem { lines.append("problem: \(p)") }
        return lines
    }

    static func describe(_ d: LabWire.DongleInfo) -> String {
        let head = "\(d.adapter ?? "?")  \(d.id ?? "address unknown")  \(d.present ? (d.powered == true ? "powered" : "off") : "missing")"
        return ([head] + identity(d).map { "    " + $0 }).joined(separator: "\n")
    }

    static func describe(_ v: LabWire.DongleView) -> String {
        let d = v.info
        var head = "\(d.name)  \(v.id)  \(v.health.rawValue)"
        head += "  host \(d.host ?? "?")  agent \(d.agent ?? "?")\(v.agentState.map { " (\($0))" } ?? "")"
        head += "  \(d.adapter ?? "?")\(d.present ? "" : " missing")"
        if let busy = v.busyWith { head += "  busy with \(busy)" }
        var lines = [head] + identity(d).map { "    " + $0 }
        var health = "health \(v.health.rawValue)"
        if let since = v.healthSince { health += " since \(when(since))" }
        if let why = v.healthReason { health += ": \(why)" }
        health += "; \(v.failures) failed check(s) and \(v.outliers) outlier run(s) in a row; seen \(when(v.firstSeen)) to \(when(v.lastSeen))"
        lines.append("    " + health)
        for e in v.history {
            lines.append("    \(when(e.at)) \(e.kind.rawValue.padding(toLength: 10, withPad: " ", startingAt: 0)) \(e.ok ? "ok  " : "FAIL") \(e.message)\(e.run.map { " [run \($0)]" } ?? "")")
            if let evidence = e.evidence, e.kind == .health || !e.ok { lines.append("        evidence: \(evidence)") }
        }
        return lines.joined(separator: "\n")
    }
}

/// This machine's host name.
func hostName() -> String? {
    var buf = [CChar](repeating: 0, count: 256)
    guard gethostname(&buf, buf.count - 1) == 0 else { return nil }
    return String(cString: buf)
}

/// A client for a coordinator URL with the operator's credential.
func coordinatorClient(_ coordinator: String, tokenFile: String?, credentials: String?, timeout: TimeInterval = 10) throws -> LabClient {
    guard let base = URL(string: coordinator), base.scheme == "http" || base.scheme == "https", base.host != nil else {
        log("--coordinator \"\(coordinator)\": expected a URL such as http://coord.lab:8700"); throw ExitCode(2)
    }
    let token: String?
    do {
        let folder = try CredentialsFolder.locate(credentials)
        try folder?.trustLabCA()
        token = try LabToken.load(file: tokenFile) ?? folder?.secret("operator.token")
    } catch { log("\(error)"); throw ExitCode(2) }
    if base.scheme == "https" && LabTrust.client == nil {
        log("--coordinator \(coordinator): https needs the lab CA: --credentials DIR holding ca.pem"); throw ExitCode(2)
    }
    return LabClient(base: base, token: token, timeout: timeout)
}

struct DonglesCheck: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "check", abstract: "Health-check dongles now: every free good or unknown one, or those named (present, powered, advertising, heard by and hearing the others).")

    @OptionGroup var options: CoordinatorOptions

    @Argument(help: "Dongles (names or addresses); none: every free dongle that may be selected.")
    var dongles: [String] = []

    @Option(help: "The longest the check may take, 1s to 10m (default: 30s).", transform: Flags.duration(min: 1, max: 600))
    var bound: TimeInterval = AgentSelection.defaultPreflight

    @Option(help: ArgumentHelp("The coordinator's JSON (the verdicts) to FILE (--json alone or --json -: standard output, instead of the text); the exit code is the same.", valueName: "FILE"))
    var json: String?

    func run() async throws {
        let base = try options.client()
        let client = LabClient(base: base.base, token: base.token, timeout: bound + 60)
        let result: LabWire.CheckResult
        do {
            result = try await client.call(CoordinatorAPI.checkDongles.method, CoordinatorAPI.checkDongles.path(), LabWire.CheckRequest(dongles: dongles.isEmpty ? nil : dongles, bound: bound))
        } catch {
            log("herald-lab dongles check: \(error)"); throw ExitCode(2)
        }
        if let json {
            try CLIConventions.writeJSON(try LabJSON.encoder.encode(result), to: json, command: "dongles check")
            if json == "-" {
                if result.verdicts.contains(where: { !$0.ok }) { throw ExitCode(1) }
                return
            }
        }
        print("health check \(result.id): \(result.verdicts.filter(\.ok).count) of \(result.verdicts.count) dongles passed")
        for v in result.verdicts {
            var line = "  \(v.dongle.padding(toLength: 16, withPad: " ", startingAt: 0)) \(v.ok ? "ok    " : "FAILED") "
            if v.ok { line += "heard \(v.saw.count), heard by \(v.seenBy.count)\(v.seconds.map { String(format: ", the last after %.1f s", $0) } ?? "")" }
            else { line += "\(v.reason ?? "")\(v.blame ? "" : " (not counted against it)")" }
            print(line)
            for w in v.warnings ?? [] { print("      warning: \(w)") }
        }
        if !result.quarantined.isEmpty { print("quarantined: \(result.quarantined.joined(separator: ", ")) (herald-lab dongles release NAME once fixed)") }
        if let m = result.message { print(m) }
        if result.verdicts.contains(where: { !$0.ok }) { throw ExitCode(1) }
    }
}

/// Sets a dongle's health.
protocol HealthAction: AsyncParsableCommand {
    static var health: LabWire.DongleHealth { get }
    var options: CoordinatorOptions { get }
    var dongle: String { get }
    var reason: String? { get }
}

extension HealthAction {
    func run() async throws {
        let client = try options.client()
        let view: LabWire.DongleView
        do {
            guard dongle.utf8.count <= 128, dongle.allSatisfy({ $0.isLetter || $0.isNumber || "-_.:".contains($0) }) else {
                log("dongle \"\(dongle)\": a name or an address"); throw ExitCode(2)
            }
            view = try await client.call(CoordinatorAPI.dongleHealth.method, CoordinatorAPI.dongleHealth.path(dongle), LabWire.HealthRequest(health: Self.health, reason: reason))
        } catch let e as ExitCode { throw e } catch {
            log("herald-lab dongles: \(error)"); throw ExitCode(2)
        }
        print("dongle \(view.info.name) (\(view.id)): \(view.health.rawValue)\(view.healthReason.map { " (\($0))" } ?? "")")
    }
}

struct DonglesQuarantine: HealthAction {
    static let configuration = CommandConfiguration(commandName: "quarantine", abstract: "Take a dongle out of selection (health bad).")
    static let health = LabWire.DongleHealth.bad
    @OptionGroup var options: CoordinatorOptions
    @Argument(help: "Dongle name or address.") var dongle: String
    @Option(help: "Why, for its history.") var reason: String?
}

struct DonglesRelease: HealthAction {
    static let configuration = CommandConfiguration(commandName: "release", abstract: "Put a dongle back into selection (health unknown: checked before its next run).")
    static let health = LabWire.DongleHealth.unknown
    @OptionGroup var options: CoordinatorOptions
    @Argument(help: "Dongle name or address.") var dongle: String
    @Option(help: "Why, for its history.") var reason: String?
}

struct DonglesMaintenance: HealthAction {
    static let configuration = CommandConfiguration(commandName: "maintenance", abstract: "Take a dongle out of selection while it is worked on (release puts it back).")
    static let health = LabWire.DongleHealth.maintenance
    @OptionGroup var options: CoordinatorOptions
    @Argument(help: "Dongle name or address.") var dongle: String
    @Option(help: "Why, for its history.") var reason: String?
}

struct DonglesRetire: HealthAction {
    static let configuration = CommandConfiguration(commandName: "retire", abstract: "Retire a dongle for good (kept in the history, never selected or checked).")
    static let health = LabWire.DongleHealth.retired
    @OptionGroup var options: CoordinatorOptions
    @Argument(help: "Dongle name or address.") var dongle: String
    @Option(help: "Why, for its history.") var reason: String?
}
