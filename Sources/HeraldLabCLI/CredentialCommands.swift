import ArgumentParser
import Foundation
import HeraldCore
import LabHTTP
import LabNet
import LabPlan
#if canImport(Glibc)
import Glibc
#endif

/// `herald-lab ca init`: a lab's CA and the coordinator host's credentials folder.
struct CACommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "ca", abstract: "The lab's certificate authority.", subcommands: [Init.self])

    struct Init: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Make the lab CA and this (coordinator) host's credentials folder: ca.pem, ca-key.pem, cert.pem and key.pem for --host names, operator.token, air.key.")

        @Option(help: "The credentials folder to make (it must not hold a CA already).")
        var dir: String

        @Option(name: .customLong("host"), help: "A name or address the coordinator (and air) is reached at; repeat for each. localhost, 127.0.0.1 and ::1 are always included.")
        var hosts: [String] = []

        @Option(help: "Days the CA and the coordinator's certificate are valid.")
        var days: Int = 3650

        @Option(help: "The CA's name.")
        var name: String = "HeraldLab CA"

        func run() async throws {
            guard (1...36_500).contains(days) else { log("--days must be between 1 and 36500"); throw ExitCode(2) }
            guard name.count <= 64, !name.isEmpty else { log("--name: 1 to 64 characters"); throw ExitCode(2) }
            for h in hosts where !hostIsValid(h) { log("--host \"\(h)\": not a host name or an IP address"); throw ExitCode(2) }
            let folder = CredentialsFolder(url: URL(fileURLWithPath: dir))
            if folder.has("ca.pem") || folder.has("ca-key.pem") {
                log("\(dir) already holds a lab CA; a second CA would make every enrolled agent's certificate useless (remove it yourself if that is what you want)")
                throw ExitCode(2)
            }
            do {
                try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o750])
                try LabCA.create(commonName: name, days: days, certificate: folder.path("ca.pem"), key: folder.path("ca-key.pem"))
                let names = (["localhost", "127.0.0.1", "::1"] + hosts).reduce(into: [String]()) { if !$0.contains($1) { $0.append($1) } }
                try LabCA.issue(caCertificate: folder.path("ca.pem"), caKey: folder.path("ca-key.pem"), commonName: "coordinator",
                                names: names, days: days, certificate: folder.path("cert.pem"), key: folder.path("key.pem"))
                try Durable.write(Data((LabToken.generate() + "\n").utf8), to: folder.url.appendingPathComponent("operator.token"), mode: 0o600)
                try Durable.write(Data((LabToken.generate() + "\n").utf8), to: folder.url.appendingPathComponent("air.key"), mode: 0o600)
                try Durable.write(Data((LabToken.generate() + "\n").utf8), to: folder.url.appendingPathComponent("scrape.token"), mode: 0o600)
                print("lab CA made in \(dir) (fingerprint \(try LabCA.fingerprint(certificate: folder.path("ca.pem"))))")
                print("coordinator certificate for \(names.joined(separator: ", "))")
                print("operator credential: \(folder.path("operator.token")); air key: \(folder.path("air.key")); scrape credential (GET /metrics only): \(folder.path("scrape.token"))")
                print("start the coordinator and the air with --credentials \(dir); enrol agents with herald-lab agents enrol NAME --host HOST")
            } catch {
                log("herald-lab ca init: \(error)")
                throw ExitCode(2)
            }
        }
    }
}

/// A DNS name or an IP literal.
func hostIsValid(_ h: String) -> Bool {
    var buf = [UInt8](repeating: 0, count: 16)
    if inet_pton(AF_INET, h, &buf) == 1 || inet_pton(AF_INET6, h, &buf) == 1 { return true }
    guard !h.isEmpty, h.utf8.count <= 253, !h.hasPrefix("."), !h.hasPrefix("-"), !h.contains("..") else { return false }
    return h.unicodeScalars.allSatisfy { ($0 >= "a" && $0 <= "z") || ($0 >= "A" && $0 <= "Z") || ($0 >= "0" && $0 <= "9") || $0 == "-" || $0 == "." }
}

/// `herald-lab agents enrol NAME --host HOST --out FILE`: the coordinator issues the agent's
/// credentials; the file goes to the node (agents/install.sh --enrolment FILE).
struct AgentsEnrol: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "enrol",
        abstract: "Enrol an agent: the coordinator issues its own credential and a certificate for its host; written to --out (mode 0600) for agents/install.sh --enrolment.")

    @OptionGroup var options: CoordinatorOptions
    @Argument(help: "Agent name (letters, digits, -, _, .).") var name: String
    @Option(name: .customLong("host"), help: "A name or address the agent is reached at (its certificate's names); repeat for each.") var hosts: [String] = []
    @Option(help: "Where to write the enrolment (JSON with the credential, the CA, the certificate and key).") var out: String
    @Option(help: "Days the agent's certificate is valid.") var days: Int = 825

    func run() async throws {
        guard SafeName.isValid(name) else { log("agent name \"\(name)\" \(SafeName.problem(with: name)!)"); throw ExitCode(2) }
        for h in hosts where !hostIsValid(h) { log("--host \"\(h)\": not a host name or an IP address"); throw ExitCode(2) }
        guard (1...3650).contains(days) else { log("--days must be between 1 and 3650"); throw ExitCode(2) }
        guard !FileManager.default.fileExists(atPath: out) else { log("--out \(out) exists; not overwriting an enrolment"); throw ExitCode(2) }
        let c = try options.client()
        let e: Enrolment
        do {
            e = try await c.call(CoordinatorAPI.enrol.method, CoordinatorAPI.enrol.path(), LabWire.EnrolRequest(name: name, hosts: hosts, coordinator: options.coordinator, days: days))
        } catch {
            log("herald-lab agents enrol: \(error)")
            throw ExitCode(2)
        }
        do { try Durable.write(try LabJSON.encoder.encode(e), to: URL(fileURLWithPath: out), mode: 0o600) } catch {
            log("cannot write \(out): \(error)")
            throw ExitCode(2)
        }
        print("agent \(name) enrolled; its credentials are in \(out) (keep it secret; install it on the node with agents/install.sh --enrolment \(out), or herald-lab enrol \(out) --dir DIR)")
    }
}

/// `herald-lab agents revoke NAME`.
struct AgentsRevoke: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "revoke", abstract: "Revoke an agent: its credential is refused from now on and it leaves the list.")
    @OptionGroup var options: CoordinatorOptions
    @Argument(help: "Agent name.") var name: String

    func run() async throws {
        guard SafeName.isValid(name) else { log("agent name \"\(name)\" \(SafeName.problem(with: name)!)"); throw ExitCode(2) }
        let _: Empty = try await options.call(CoordinatorAPI.revoke.method, CoordinatorAPI.revoke.path(name))
        print("agent \(name) revoked")
    }
}

/// `herald-lab enrol FILE --dir DIR`: unpacks an enrolment into a node's credentials folder.
struct EnrolCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "enrol",
        abstract: "Install an enrolment made by herald-lab agents enrol into this node's credentials folder (ca.pem, cert.pem, key.pem, agent.json).")

    @Argument(help: "The enrolment file.") var file: String
    @Option(help: "The credentials folder to write (e.g. /etc/herald-lab).") var dir: String

    func run() async throws {
        do {
            let data = try RegularFile.read(file, limit: 256 * 1024)
            let e: Enrolment
            do { e = try LabJSON.decoder.decode(Enrolment.self, from: data) } catch {
                log("\(file): not an enrolment (\(error))")
                throw ExitCode(2)
            }
            try e.install(into: URL(fileURLWithPath: dir))
            print("agent \(e.credential.name)'s credentials installed in \(dir)\(e.coordinator.map { "; its coordinator: \($0)" } ?? "")")
        } catch let e as ExitCode { throw e } catch {
            log("herald-lab enrol: \(error)")
            throw ExitCode(2)
        }
    }
}

/// Reads a small regular file (never a FIFO or a device), at most `limit` bytes.
enum RegularFile {
    static func read(_ path: String, limit: Int) throws -> Data {
        var st = stat()
        guard stat(path, &st) == 0 else { throw CredentialError("\(path): no such file") }
        guard (st.st_mode & S_IFMT) == S_IFREG else { throw CredentialError("\(path): not a regular file") }
        guard st.st_size <= limit else { throw CredentialError("\(path): larger than \(limit) bytes") }
        return try Data(contentsOf: URL(fileURLWithPath: path))
    }
}
