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

/// `herald-lab run PLAN --coordinator URL`, or `herald-lab run --attach RUN --coordinator URL`
struct RunCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "run",
        abstract: "Submit a plan to a coordinator (or follow a submitted run again), show the nodes live, fetch the bundle and exit with the plan's verdict (0 pass, 1 fail, 2 error; 130 when Ctrl-C detaches, the run going on).",
        discussion: "Ctrl-C detaches: the run goes on at the coordinator; `herald-lab run --attach RUN` follows it again and fetches its bundle, `herald-lab runs abort RUN` stops it."
    )

    @Argument(help: "Plan file (YAML); none with --attach.")
    var plan: String?

    @Option(help: "Follow a run already submitted (its id, as `herald-lab runs` lists it) instead of submitting a plan.")
    var attach: String?

    @Option(help: "Also write the run's junit.xml here, for the CI system.")
    var junit: String?

    @Option(help: "Also write the run's summary.json here.")
    var summary: String?

    @OptionGroup var options: CoordinatorOptions
    var coordinator: String { options.coordinator }

    @Option(help: "Folder to unpack the bundle into (default: results).")
    var out: String = "results"

    func validate() throws {
        switch (plan, attach) {
        case (nil, nil): throw ValidationError("give a plan to submit, or --attach RUN to follow a submitted run")
        case (.some, .some): throw ValidationError("give a plan or --attach RUN, not both")
        case (nil, .some(let id)) where !SafeName.isValid(id): throw ValidationError("--attach: run id \"\(id.prefix(64))\" \(SafeName.problem(with: id)!)")
        default: break
        }
    }

    /// The run submitted now, or the one named by --attach.
    func startOrAttach(_ client: LabClient) async throws -> RunRecord {
        if let attach {
            let record: RunRecord = try await options.call(CoordinatorAPI.run.method, CoordinatorAPI.run.path(attach))
            if let problem = Self.runIdProblem(record.id) { throw BundleFailure(description: "\(problem): not followed") }
            print("run \(record.id) attached: \(record.nodes.count) nodes for \(formatDuration(record.duration)), \(record.state.rawValue)")
            return record
        }
        guard let plan else { throw ExitCode(2) }
        let parsed = try loadPlan(plan) // refuse a bad plan here, with field paths
        let personas = parsed.nodes.filter { $0.persona != nil }
        if !personas.isEmpty {
            log("herald-lab run: \(plan): \(personas.map { "\($0.name) (\($0.persona!.rawValue))" }.joined(separator: ", ")): personas are simulated phones; a lab runs Linux nodes only (herald-lab simulate runs personas)")
            throw ExitCode(2)
        }
        let text = try String(contentsOfFile: plan, encoding: .utf8)
        if parsed.study != nil { throw StudyPlanGiven(text: text) }
        do {
            let record = try await Self.submit(client, text: text, name: URL(fileURLWithPath: plan).lastPathComponent)
            print("run \(record.id) submitted: \(record.nodes.count) nodes for \(formatDuration(record.duration))")
            return record
        } catch let e as SubmitFailure {
            log("herald-lab run: \(e)")
            throw ExitCode(2)
        }
    }

    /// A plan with a `study:` block: run as a study (RunStudy.swift).
    struct StudyPlanGiven: Error { var text: String }

    /// Why a plan was not submitted: the coordinator could not be reached, or it refused the plan.
    enum SubmitFailure: Error, CustomStringConvertible {
        case unreachable(coordinator: String, error: String)
        case refused(status: Int, message: String)
        /// Taken, under a run id that is not a safe name (`runIdProblem`'s text).
        case badRunId(problem: String)
        var description: String {
            switch self {
            case .unreachable(let c, let e): return "cannot submit the plan to \(c): \(e)"
            case .refused(let status, let message): return "the coordinator refused the plan (HTTP \(status)):\n\(OutsideText.escaped(message))"
            case .badRunId(let problem): return "\(problem): not followed"
            }
        }
    }

    /// Submits plan text; the run's record as the coordinator made it.
    static func submit(_ client: LabClient, text: String, name: String) async throws -> RunRecord {
        let status: Int, body: Data
        let query = name.addingPercentEncoding(withAllowedCharacters: .alphanumerics.union(CharacterSet(charactersIn: "-._"))) ?? "plan"
        do {
            (status, body, _) = try await client.request(CoordinatorAPI.submit.method, CoordinatorAPI.submit.path(query: "name=\(query)"), body: Data(text.utf8))
        } catch {
            // Refused, unresolvable, another CA, http against https, TLS failures: all errors.
            throw SubmitFailure.unreachable(coordinator: client.base.absoluteString, error: "\(error)")
        }
        guard status == 201, let record = try? JSONDecoder().decode(RunRecord.self, from: body) else {
            let message = (try? JSONDecoder().decode([String: String].self, from: body))?["error"] ?? String(decoding: body, as: UTF8.self)
            throw SubmitFailure.refused(status: status, message: message)
        }
        if let problem = runIdProblem(record.id) { throw SubmitFailure.badRunId(problem: problem) }
        return record
    }

    /// Why the coordinator's run id may not be used, in printable text; nil when it is a safe
    /// name. Only then is it printed, put in a URL or made a file's name (issue 36: a hostile
    /// coordinator made `--out DIR` write DIR/../<id>.tar.gz, and `run` follow /v1/runs/../x).
    static func runIdProblem(_ id: String) -> String? {
        SafeName.problem(with: id).map { "the coordinator's run id \"\(OutsideText.escaped(id, limit: 80, quotes: true))\" \(OutsideText.escaped($0))" }
    }

    /// What Ctrl-C prints while following: the commands to follow the run again and to stop it,
    /// with the options given (`options`: CoordinatorOptions.pasteable; the credential by its
    /// file or folder, never its value).
    static func detachHint(_ id: String, options: String) -> String {
        """

        herald-lab run: detached; run \(id) goes on at the coordinator.
          follow it again: herald-lab run --attach \(id) \(options)
          stop it:         herald-lab runs abort \(id) \(options)

        """
    }

    /// Ctrl-C while following: the run goes on at the coordinator; say so, and how to follow it again.
    static func detachOnInterrupt(_ id: String, options: String) -> DispatchSourceSignal {
        signal(SIGINT, SIG_IGN)
        let source = DispatchSource.makeSignalSource(signal: SIGINT, queue: DispatchQueue(label: "heraldlab.run.interrupt"))
        let hint = detachHint(id, options: options)
        source.setEventHandler {
            FileHandle.standardError.write(Data(hint.utf8))
            Foundation.exit(130)
        }
        source.resume()
        return source
    }

    /// Exit 1 means only that the plan's verdict failed: every error (the plan, reaching the
    /// coordinator, TLS, the bundle, the disk) is exit 2, with its reason.
    func run() async throws {
        do { try await submitAndWatch() } catch let e as ExitCode { throw e } catch let study as StudyPlanGiven {
            try await runStudy(text: study.text)
        } catch {
            log("herald-lab run: \(error)")
            throw ExitCode(2)
        }
    }

    private func submitAndWatch() async throws {
        let client = try options.client()
        let record = try await startOrAttach(client)
        print("dashboard: \(client.base.absoluteString.trimmingCharacters(in: CharacterSet(charactersIn: "/")))\(Coordinator.dashboardPath(run: record.id))"); fflush(nil)
        let current = try await follow(client, record)
        guard current.state == .complete || current.state == .aborted else {
            log("herald-lab run: run \(current.id) \(current.state.rawValue): \(OutsideText.escaped(current.message ?? ""))")
            for n in current.nodes where n.message != nil { log("  \(n.name) (agent \(n.agent), \(OutsideText.escaped(n.agentURL))): \(n.state.rawValue): \(OutsideText.escaped(n.message!))") }
            throw ExitCode(2)
        }
        let outDir = URL(fileURLWithPath: out)
        do { try await Self.fetchBundle(client, current, into: outDir, options: options.pasteable) } catch {
            log("herald-lab run: \(error)")
            throw ExitCode(2)
        }
        let bundle = outDir.appendingPathComponent(current.id)
        print("bundle: \(bundle.path)")
        let manifest: Manifest?
        do { manifest = try Manifest.read(from: bundle.appendingPathComponent("manifest.json")) } catch {
            log("herald-lab run: \(OutsideText.escaped("\(bundle.path)/manifest.json")): \(OutsideText.escaped("\(error)")) (no clock offsets or skew to show)")
            manifest = nil
        }
        if let m = manifest {
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
        let summaryFile = bundle.appendingPathComponent("report/summary.json")
        var summary: AnalysisResult?
        if FileManager.default.fileExists(atPath: summaryFile.path) {
            do { summary = try ReportWriter.readSummary(summaryFile) } catch {
                log("herald-lab run: \(OutsideText.escaped(summaryFile.path)): \(OutsideText.escaped("\(error)"))")
                throw ExitCode(2)
            }
        }
        if let summary {
            print(Summary.text(summary, mode: .strict))
            print("report: \(bundle.appendingPathComponent("report/report.html").path)")
            try copyForCI(from: bundle.appendingPathComponent("report"))
            // An aborted run has no verdict (issue 40): exit 2, never the plan's FAIL.
            if current.state == .aborted || summary.input.aborted == true { throw ExitCode(2) }
            if !summary.passed { throw ExitCode(1) }
        } else {
            log("herald-lab run: the bundle has no report (\(OutsideText.escaped(current.message ?? "analysis failed")))")
            throw ExitCode(2)
        }
    }

    /// Follows a run to its end, showing the nodes live (a table redrawn on a terminal, else
    /// every 10 s); Ctrl-C detaches (the run goes on). The run's final record.
    func follow(_ client: LabClient, _ record: RunRecord) async throws -> RunRecord {
        let interrupt = Self.detachOnInterrupt(record.id, options: options.pasteable)
        let live = isatty(STDOUT_FILENO) == 1
        var drawnLines = 0
        var lastPlain = Date.distantPast
        var current = record
        var unanswered: Date?
        while true {
            do {
                current = try await client.call(CoordinatorAPI.run.method, CoordinatorAPI.run.path(record.id))
                unanswered = nil
            } catch {
                // A coordinator that is gone for a minute is given up on (it keeps the run if it comes back).
                let since = unanswered ?? Date()
                unanswered = since
                if Date().timeIntervalSince(since) > 60 {
                    log("herald-lab run: the coordinator at \(coordinator) has not answered for 60 s (\(error)); run \(record.id) is still recorded there: `herald-lab runs list \(options.pasteable)` shows it")
                    throw ExitCode(2)
                }
            }
            // The id checked at submission is the one used from here on.
            if current.id != record.id {
                log("herald-lab run: asked for run \(record.id), the coordinator answered with the record of run \"\(OutsideText.escaped(current.id, limit: 80, quotes: true))\": not followed")
                throw ExitCode(2)
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
        // The run has ended: Ctrl-C from here on stops the fetch, as any command's would.
        interrupt.cancel()
        signal(SIGINT, SIG_DFL)
        return current
    }

    struct BundleFailure: Error, CustomStringConvertible { var description: String }

    /// Fetches a run's bundle to disk (streamed, hashed on the way), checks it against the
    /// coordinator's hash and unpacks it: into `dir/<run id>`, or `dir/<folder>` when given.
    /// Only the archive's `<run id>/` is unpacked, and kept only when it holds nothing but files
    /// and folders; else, as when the fetch fails, no bundle folder is left. Returns the bundle folder.
    @discardableResult
    static func fetchBundle(_ client: LabClient, _ current: RunRecord, into outDir: URL, folder: String? = nil, options: String? = nil) async throws -> URL {
        // The run id is the coordinator's text: it names a file here only once it is a safe name
        // (a hostile coordinator once made `--out DIR` write DIR/../<id>.tar.gz).
        if let problem = runIdProblem(current.id) { throw BundleFailure(description: "\(problem): no file is named after it") }
        if let folder, let problem = SafeName.problem(with: folder) {
            throw BundleFailure(description: "folder \"\(OutsideText.escaped(folder, limit: 80, quotes: true))\" \(OutsideText.escaped(problem))")
        }
        try FileManager.default.createDirectory(at: outDir, withIntermediateDirectories: true)
        let name = folder ?? current.id
        do { try Durable.refuseLink(outDir.appendingPathComponent(name)) } catch { throw BundleFailure(description: "\(error)") }
        let tarURL = outDir.appendingPathComponent("\(name).tar.gz")
        let part = outDir.appendingPathComponent(".\(name).tar.gz.part")
        FileManager.default.createFile(atPath: part.path, contents: nil)
        var hasher = SHA256()
        do {
            let result = try await FileDownload.get(client.base.appendingPathComponent("v1/runs/\(current.id)/bundle"), headers: client.token.map { ["Authorization": "Bearer \($0)"] } ?? [:],
                                              appendingTo: part, hasher: &hasher, timeout: 120)
            guard result.status == 200 else { throw LabClient.Failure(status: result.status, message: "unexpected status") }
        } catch {
            try? FileManager.default.removeItem(at: part)
            throw BundleFailure(description: "cannot fetch the bundle of \(current.id): \(error)")
        }
        let sha = hasher.finalizeHex()
        if let expected = current.bundleSha256, expected != sha {
            try? FileManager.default.removeItem(at: part)
            throw BundleFailure(description: "the bundle of \(current.id) arrived damaged (SHA-256 \(sha), the coordinator says \(expected)); fetch it again with `herald-lab run --attach \(current.id)\(options.map { " " + $0 } ?? "")` or from \(client.base.absoluteString)/v1/runs/\(current.id)/bundle")
        }
        try Self.removeIfPresent(tarURL)
        try FileManager.default.moveItem(at: part, to: tarURL)
        // The archive holds `<run id>/...`: that alone is unpacked (the archive's other member
        // names are the coordinator's text), into a folder of the client's own, and moved into
        // place (under the study's own name for the run, when given) once it holds nothing but
        // files and folders. A link kept in DIR had a later archive of the run written through it,
        // outside DIR; tar itself refuses members with `..` and writes none through a link it made.
        let unpacking = outDir.appendingPathComponent(".\(name).unpacking")
        try Self.removeIfPresent(unpacking)
        try FileManager.default.createDirectory(at: unpacking, withIntermediateDirectories: false)
        defer {
            // Scratch only (the bundle is moved out first): a failure is said, not fatal.
            do { try Self.removeIfPresent(unpacking) } catch { log("herald-lab run: could not remove \(unpacking.path): \(error.localizedDescription)") }
        }
        let tar = Process()
        tar.executableURL = URL(fileURLWithPath: "/bin/tar")
        tar.arguments = ["-xzf", tarURL.path, "--no-same-owner", "--no-same-permissions", "-C", unpacking.path, "--", current.id]
        try tar.run()
        tar.waitUntilExit()
        guard tar.terminationStatus == 0 else { throw BundleFailure(description: "tar could not unpack \(tarURL.path) (exit \(tar.terminationStatus))") }
        let unpacked = unpacking.appendingPathComponent(current.id)
        if let odd = notFileOrFolder(unpacked, as: current.id) {
            throw BundleFailure(description: "the bundle of \(current.id) holds \(OutsideText.escaped(odd)): not unpacked (a bundle holds files and folders only)")
        }
        let bundle = outDir.appendingPathComponent(name)
        try Self.removeIfPresent(bundle)
        try FileManager.default.moveItem(at: unpacked, to: bundle)
        return bundle
    }

    /// Removes what is at `url` (a link itself, not what it points to); nothing there is fine,
    /// any other failure is thrown (a stale folder left in place would be unpacked over).
    static func removeIfPresent(_ url: URL) throws {
        var st = stat()
        guard lstat(url.path, &st) == 0 else { return }
        try FileManager.default.removeItem(at: url)
    }

    /// The first entry at or under `url` (links not followed) that is neither a file nor a
    /// folder, as its path (from `path`, url's name) and what it is; nil when there is none.
    static func notFileOrFolder(_ url: URL, as path: String) -> String? {
        var st = stat()
        guard lstat(url.path, &st) == 0 else { return "\(path) (\(String(cString: strerror(errno))))" }
        switch st.st_mode & S_IFMT {
        case S_IFREG: return nil
        case S_IFDIR:
            guard let names = try? FileManager.default.contentsOfDirectory(atPath: url.path) else { return "\(path) (a folder that cannot be read)" }
            for n in names.sorted() {
                if let odd = notFileOrFolder(url.appendingPathComponent(n), as: "\(path)/\(n)") { return odd }
            }
            return nil
        case S_IFLNK: return "\(path), a symbolic link"
        default: return "\(path), neither a file nor a folder"
        }
    }

    /// --junit and --summary: the report's files where the CI system looks for them.
    func copyForCI(from report: URL) throws {
        for (name, destination) in [("junit.xml", junit), ("summary.json", summary)] {
            guard let destination else { continue }
            let to = URL(fileURLWithPath: destination)
            do {
                let data = try Data(contentsOf: report.appendingPathComponent(name))
                try FileManager.default.createDirectory(at: to.deletingLastPathComponent(), withIntermediateDirectories: true)
                try data.write(to: to, options: .atomic)
                print("\(name): \(to.path)")
            } catch {
                log("herald-lab run: cannot write \(name) to \(destination): \(error.localizedDescription)")
                throw ExitCode(2)
            }
        }
    }

    static func table(_ r: RunRecord) -> [String] {
        // The phase as the nodes say (arming, armed, running, gathering), as the dashboard shows it.
        let progress = RunProgress(r, now: Date().timeIntervalSince1970)
        var lines = ["run \(OutsideText.escaped(r.id)): \(r.state.isFinal ? r.state.rawValue : progress.text)"]
        lines.append("node            agent           state      peers  reads  RSSI/min")
        for n in r.nodes {
            let s = n.status
            // Names, agents and states are the agents' and the plan's text: escaped.
            let (name, agent, state) = (OutsideText.escaped(n.name), OutsideText.escaped(n.agent), n.state.rawValue)
            lines.append(String(format: "%@ %@ %@ %5d  %5d  %8d", name.padding(toLength: 15, withPad: " ", startingAt: 0), agent.padding(toLength: 15, withPad: " ", startingAt: 0),
                                state.padding(toLength: 10, withPad: " ", startingAt: 0), s?.peersDetected ?? 0, s?.payloadsRead ?? 0, s?.rssiLastMinute ?? 0))
        }
        return lines
    }
}
