import ArgumentParser
import Foundation
import HeraldCore
import LabCoordinator
import LabHTTP
import LabNet
import LabTestSupport
import XCTest
@testable import HeraldLabCLI
#if canImport(Glibc)
import Glibc
#endif

/// Issue 36, item 5: `herald-lab run --out DIR` took the coordinator's run id as a file name, and
/// a hostile coordinator made it write DIR/../<id>.tar.gz. Here a coordinator in this process (a
/// socket server on 127.0.0.1, any free port) answers with hostile run ids, folders and archives,
/// and the command's own code fetches from it: `RunCommand.fetchBundle` with the record read the
/// way `follow` reads it (LabClient), and the whole `run` command (submit or --attach, follow,
/// fetch). Each refusal names the problem in printable text, nothing appears outside DIR (the
/// whole tree around it is compared before and after), and no file is named after the server's
/// text; a valid id is fetched to exactly the files expected, and an answer cut in the middle of
/// the archive leaves no file that looks whole.
final class HostileCoordinatorTests: XCTestCase {
    /// Compared whole before and after each fetch: root/parent/out is --out DIR.
    var root: URL!
    var parent: URL!
    var dir: URL!
    /// Archives, plans and captured output are made here, outside `root`.
    var scratch: URL!
    var coordinator: HostileCoordinator!
    var client: LabClient!

    override func setUpWithError() throws {
        let base = FileManager.default.temporaryDirectory.appendingPathComponent("hostile-coordinator-\(UUID().uuidString)")
        root = base.appendingPathComponent("root")
        parent = root.appendingPathComponent("parent")
        dir = parent.appendingPathComponent("out")
        scratch = base.appendingPathComponent("scratch")
        try FileManager.default.createDirectory(at: parent, withIntermediateDirectories: true)
        try FileManager.default.createDirectory(at: scratch, withIntermediateDirectories: true)
        try Data("a file of the user's beside DIR\n".utf8).write(to: parent.appendingPathComponent("sibling.txt"))
        coordinator = try HostileCoordinator()
        client = LabClient(base: URL(string: "http://127.0.0.1:\(coordinator.port)")!, token: nil, timeout: 10)
    }

    override func tearDownWithError() throws {
        coordinator?.stop()
        if let root { try? FileManager.default.removeItem(at: root.deletingLastPathComponent()) }
    }

    /// Run ids (and folders) a hostile coordinator sends, and the problem the client names for each.
    static let hostileNames: [(name: String, problem: String)] = [
        ("../escape", "must not start with '.'"),
        ("..", "must not start with '.'"),
        ("/etc/x", #"found "/""#),
        ("-g", "must not start with '-'"),
        ("a/b", #"found "/""#),
        ("a\u{0}b", #"found "\x00""#),
        ("a\nb", #"found "\x0A""#),
        (String(repeating: "r", count: 300), "is longer than 64 characters"),
        ("run\u{202E}zg.tar", #"found "\u{202E}""#),
        ("", "is empty"),
    ]

    // MARK: fetchBundle, with the record as `follow` reads it

    func testHostileRunIdsAreRefusedBeforeAnyFileOrRequestIsNamedAfterThem() async throws {
        let bundle = try archive([.file("r1/manifest.json", "{}")])
        for (id, problem) in Self.hostileNames {
            let label = OutsideText.escaped(id, limit: 20, quotes: true)
            coordinator.answer(record: Self.record(id: id, sha: SHA256.hash(bundle)), bundle: bundle)
            let record: RunRecord = try await client.call("GET", "/v1/runs/current")
            XCTAssertEqual(record.id, id, "the client holds the server's text as sent")
            let before = try snapshot()
            let etcX = FileManager.default.fileExists(atPath: "/etc/x")
            // As `herald-lab run` fetches (into DIR/<id>) and as a study does (into DIR/<folder>).
            for folder in [nil, "run-01"] as [String?] {
                let text = await refusal("\(label), folder \(folder ?? "none")") { try await RunCommand.fetchBundle(self.client, record, into: self.dir, folder: folder) }
                XCTAssertTrue(text.contains("the coordinator's run id \"\(OutsideText.escaped(id, limit: 80, quotes: true))\" "), "\(label): \(text)")
                XCTAssertTrue(text.contains(problem), "\(label): the problem named: \(text)")
                XCTAssertTrue(text.contains("no file is named after it"), "\(label): \(text)")
                assertPrintable(text, label)
            }
            XCTAssertEqual(try snapshot(), before, "\(label): nothing written anywhere around DIR, DIR not even made")
            XCTAssertEqual(FileManager.default.fileExists(atPath: "/etc/x"), etcX, label)
            XCTAssertEqual(coordinator.requests, ["GET /v1/runs/current"], "\(label): the bundle was not asked for with the id in its URL")
        }
    }

    func testHostileFoldersAreRefusedBeforeAnythingIsWritten() async throws {
        let id = "r20260101-0001"
        let bundle = try archive([.file("\(id)/manifest.json", "{}")])
        coordinator.answer(record: Self.record(id: id, sha: SHA256.hash(bundle)), bundle: bundle)
        let record: RunRecord = try await client.call("GET", "/v1/runs/\(id)")
        let before = try snapshot()
        for (folder, problem) in Self.hostileNames {
            let label = OutsideText.escaped(folder, limit: 20, quotes: true)
            let text = await refusal(label) { try await RunCommand.fetchBundle(self.client, record, into: self.dir, folder: folder) }
            XCTAssertTrue(text.hasPrefix("folder \"\(OutsideText.escaped(folder, limit: 80, quotes: true))\" "), "\(label): \(text)")
            XCTAssertTrue(text.contains(problem), "\(label): the problem named: \(text)")
            assertPrintable(text, label)
            XCTAssertEqual(try snapshot(), before, "\(label): nothing written")
        }
        XCTAssertEqual(coordinator.requests, ["GET /v1/runs/\(id)"], "no bundle asked for")
    }

    /// The benign case: the test fails if the client stops fetching.
    func testAValidRunIdIsFetchedToExactlyItsFiles() async throws {
        let id = "r20260101-0002_a.b"
        let manifest = #"{"run":"r20260101-0002_a.b"}"#, summary = #"{"passed":true}"#
        let bundle = try archive([.file("\(id)/manifest.json", manifest), .file("\(id)/report/summary.json", summary)])
        coordinator.answer(record: Self.record(id: id, sha: SHA256.hash(bundle)), bundle: bundle)
        let record: RunRecord = try await client.call("GET", "/v1/runs/\(id)")
        var expected = try snapshot()
        let fetched = try await RunCommand.fetchBundle(client, record, into: dir)
        XCTAssertEqual(fetched.path, dir.appendingPathComponent(id).path)
        expected.merge(Self.unpacked(as: "parent/out/\(id)", archive: bundle, manifest: manifest, summary: summary)) { $1 }
        expected["parent/out"] = "folder"
        XCTAssertEqual(try snapshot(), expected, "DIR holds the archive and its unpacked folder, nothing else")
        XCTAssertEqual(coordinator.requests, ["GET /v1/runs/\(id)", "GET /v1/runs/\(id)/bundle"])

        // As a study fetches it: under the study's own name for the run (the plan's text).
        let study = try await RunCommand.fetchBundle(client, record, into: dir, folder: "level-a-1")
        XCTAssertEqual(study.path, dir.appendingPathComponent("level-a-1").path)
        expected.merge(Self.unpacked(as: "parent/out/level-a-1", archive: bundle, manifest: manifest, summary: summary)) { $1 }
        XCTAssertEqual(try snapshot(), expected)

        // Fetched again over the first copy: the same files.
        try await RunCommand.fetchBundle(client, record, into: dir)
        XCTAssertEqual(try snapshot(), expected)
    }

    // MARK: The archive's own member names

    /// The archive's members outside the run's folder (another folder, an absolute name, a
    /// name like the archive's own) are not unpacked: DIR gets the run's folder only.
    func testArchiveMembersOutsideTheRunsFolderAreNotUnpacked() async throws {
        let id = "r20260101-0003"
        let bundle = try archive([.file("\(id)/manifest.json", "{}"), .file("other/x.txt", "stray"), .file("/absolute-member.txt", "stray"),
                                  .file("\(id).tar.gz", "stray"), .file("r20260101-0004/manifest.json", "another run's")])
        coordinator.answer(record: Self.record(id: id, sha: SHA256.hash(bundle)), bundle: bundle)
        let record: RunRecord = try await client.call("GET", "/v1/runs/\(id)")
        var expected = try snapshot()
        try await RunCommand.fetchBundle(client, record, into: dir)
        expected["parent/out"] = "folder"
        expected["parent/out/\(id).tar.gz"] = "file " + SHA256.hash(bundle)
        expected["parent/out/\(id)"] = "folder"
        expected["parent/out/\(id)/manifest.json"] = "file " + SHA256.hash(Data("{}".utf8))
        XCTAssertEqual(try snapshot(), expected, "only the run's folder unpacked")
    }

    /// Members that climb out (`..`, through a link the archive made) are refused by tar; the
    /// fetch fails naming it, and leaves no unpacked folder (none that could hold the link).
    func testArchiveMembersThatClimbOutAreRefusedAndLeaveNoBundle() async throws {
        let id = "r20260101-0005"
        let bundle = try archive([.file("\(id)/manifest.json", "{}"), .file("\(id)/../../up.txt", "out"), .file("../escape.txt", "out"),
                                  .link("\(id)/link", to: parent.path), .file("\(id)/link/through.txt", "out")])
        coordinator.answer(record: Self.record(id: id, sha: SHA256.hash(bundle)), bundle: bundle)
        let record: RunRecord = try await client.call("GET", "/v1/runs/\(id)")
        var expected = try snapshot()
        let text = await refusal("climbing members") { try await RunCommand.fetchBundle(self.client, record, into: self.dir) }
        XCTAssertTrue(text.contains("tar could not unpack \(dir.appendingPathComponent("\(id).tar.gz").path)"), text)
        expected["parent/out"] = "folder"
        expected["parent/out/\(id).tar.gz"] = "file " + SHA256.hash(bundle)
        XCTAssertEqual(try snapshot(), expected, "nothing outside DIR; in DIR the archive as fetched, no unpacked folder")
    }

    /// A link in the archive is refused: unpacked and kept, a later archive of the same run
    /// (`run --attach` again, or a coordinator that names a new run the same) was written
    /// through it, outside DIR.
    func testALinkInTheArchiveIsRefusedSoNoLaterArchiveWritesThroughIt() async throws {
        let id = "r20260101-0006"
        let planting = try archive([.file("\(id)/manifest.json", "{}"), .link("\(id)/link", to: parent.path)])
        coordinator.answer(record: Self.record(id: id, sha: SHA256.hash(planting)), bundle: planting)
        let record: RunRecord = try await client.call("GET", "/v1/runs/\(id)")
        let outside = try snapshot()
        let text = await refusal("a link") { try await RunCommand.fetchBundle(self.client, record, into: self.dir) }
        XCTAssertTrue(text.contains("\(id)/link"), "the link is named: \(text)")
        XCTAssertTrue(text.contains("symbolic link"), text)
        assertPrintable(text, "a link")

        let through = try archive([.file("\(id)/manifest.json", "{}"), .file("\(id)/link/planted.txt", "written through the link")])
        coordinator.answer(record: Self.record(id: id, sha: SHA256.hash(through)), bundle: through)
        let second: RunRecord = try await client.call("GET", "/v1/runs/\(id)")
        try await RunCommand.fetchBundle(client, second, into: dir)
        let after = try snapshot()
        XCTAssertNil(after["parent/planted.txt"], "written outside DIR through a link the first archive left")
        XCTAssertEqual(after.filter { !$0.key.hasPrefix("parent/out") }, outside, "nothing outside DIR")
        XCTAssertEqual(after["parent/out/\(id)/link"], "folder", "the second archive's own folder, in DIR")
        XCTAssertFalse(after.values.contains { $0.hasPrefix("link") }, "no link anywhere: \(after)")
    }

    // MARK: Answers that end early or arrive damaged

    /// The server closes the connection half way through the archive (its Content-Length says
    /// more): an error saying so, and DIR holds no archive, no partial download, no folder;
    /// with the coordinator's hash and without one (then only the length tells).
    func testAnArchiveCutInTheMiddleLeavesNoFileThatLooksWhole() async throws {
        let id = "r20260101-0007"
        var generator = SystemRandomNumberGenerator()
        let noise = Data((0..<(256 << 10)).map { _ in UInt8.random(in: 0...255, using: &generator) })
        let bundle = try archive([.file("\(id)/manifest.json", "{}"), .data("\(id)/nodes/n1.log", noise)])
        for sha in [SHA256.hash(bundle), nil] {
            coordinator.answer(record: Self.record(id: id, sha: sha), bundle: bundle, cut: bundle.count / 2)
            let record: RunRecord = try await client.call("GET", "/v1/runs/\(id)")
            var expected = try snapshot()
            let text = await refusal("cut, hash \(sha == nil ? "none" : "given")") { try await RunCommand.fetchBundle(self.client, record, into: self.dir) }
            XCTAssertTrue(text.contains("cannot fetch the bundle of \(id): "), text)
            XCTAssertTrue(text.contains("connection closed after \(bundle.count / 2) of \(bundle.count) bytes"), text)
            expected["parent/out"] = "folder"
            XCTAssertEqual(try snapshot(), expected, "DIR empty: no \(id).tar.gz, no .\(id).tar.gz.part, no \(id)/")
            XCTAssertEqual(coordinator.requests.last, "GET /v1/runs/\(id)/bundle")
        }
    }

    /// An archive of the whole length whose hash is not the coordinator's: refused, nothing kept.
    func testAnArchiveThatIsNotTheOneTheCoordinatorHashedIsNotKept() async throws {
        let id = "r20260101-0008"
        let bundle = try archive([.file("\(id)/manifest.json", "{}")])
        let other = try archive([.file("\(id)/manifest.json", "{\"other\":1}")])
        coordinator.answer(record: Self.record(id: id, sha: SHA256.hash(other)), bundle: bundle)
        let record: RunRecord = try await client.call("GET", "/v1/runs/\(id)")
        var expected = try snapshot()
        let text = await refusal("damaged") { try await RunCommand.fetchBundle(self.client, record, into: self.dir) }
        XCTAssertTrue(text.contains("the bundle of \(id) arrived damaged (SHA-256 \(SHA256.hash(bundle)), the coordinator says \(SHA256.hash(other)))"), text)
        expected["parent/out"] = "folder"
        XCTAssertEqual(try snapshot(), expected)
    }

    // MARK: The whole command

    /// `herald-lab run PLAN --out DIR` against a coordinator whose record of the submitted run
    /// has a hostile id: exit 2 naming the problem, no output with the id's raw control or
    /// direction characters, nothing written, and the id never put in a URL (not followed).
    func testRunCommandRefusesAHostileRunIdAtSubmission() async throws {
        let plan = try planFile()
        let token = try tokenFile()
        for (id, problem) in Self.hostileNames {
            let label = OutsideText.escaped(id, limit: 20, quotes: true)
            coordinator.answer(record: Self.record(id: id, sha: nil), bundle: try archive([.file("r1/manifest.json", "{}")]))
            let before = try snapshot()
            let (code, output) = try await run([plan, "--coordinator", "http://127.0.0.1:\(coordinator.port)", "--token-file", token, "--out", dir.path])
            XCTAssertEqual(code, 2, "\(label): \(output)")
            XCTAssertTrue(output.contains("the coordinator's run id \"\(OutsideText.escaped(id, limit: 80, quotes: true))\" "), "\(label): \(output)")
            XCTAssertTrue(output.contains(problem), "\(label): the problem named: \(output)")
            assertPrintable(output, label, lines: true)
            XCTAssertEqual(try snapshot(), before, "\(label): nothing written")
            XCTAssertEqual(coordinator.requests, ["POST /v1/runs?name=hostile.yaml"], "\(label): the id was not followed")
        }
    }

    /// `run --attach RUN`: the id asked for passed the client's own check, and the coordinator
    /// answers a record with another, hostile one.
    func testRunAttachRefusesARecordWithAHostileRunId() async throws {
        let token = try tokenFile()
        coordinator.answer(record: Self.record(id: "../escape", sha: nil), bundle: try archive([.file("r1/manifest.json", "{}")]))
        let before = try snapshot()
        let (code, output) = try await run(["--attach", "r20260101-0009", "--coordinator", "http://127.0.0.1:\(coordinator.port)", "--token-file", token, "--out", dir.path])
        XCTAssertEqual(code, 2, output)
        XCTAssertTrue(output.contains(#"the coordinator's run id "../escape" must not start with '.'"#), output)
        XCTAssertEqual(try snapshot(), before)
        XCTAssertEqual(coordinator.requests, ["GET /v1/runs/r20260101-0009"])
    }

    /// The run submitted under a valid id, and followed: the coordinator's record of it then
    /// names another, hostile run (failed, so that its id would be printed): not followed further.
    func testRunCommandRefusesARecordWhoseIdChangesWhileFollowed() async throws {
        let plan = try planFile()
        let token = try tokenFile()
        let id = "r20260101-0011"
        var changed = try JSONSerialization.jsonObject(with: Self.record(id: "x\u{202E}gpj.exe", sha: nil)) as! [String: Any]
        changed["state"] = "failed"
        coordinator.answer(record: Self.record(id: id, sha: nil), bundle: try archive([.file("\(id)/manifest.json", "{}")]),
                           followed: try JSONSerialization.data(withJSONObject: changed))
        let before = try snapshot()
        let (code, output) = try await run([plan, "--coordinator", "http://127.0.0.1:\(coordinator.port)", "--token-file", token, "--out", dir.path])
        XCTAssertEqual(code, 2, output)
        XCTAssertTrue(output.contains(#"asked for run r20260101-0011, the coordinator answered with the record of run "x\u{202E}gpj.exe": not followed"#), output)
        assertPrintable(output, "a changed id", lines: true)
        XCTAssertEqual(try snapshot(), before)
        XCTAssertEqual(coordinator.requests, ["POST /v1/runs?name=hostile.yaml", "GET /v1/runs/\(id)"])
    }

    /// The whole command with a valid id: submitted, followed, fetched and unpacked into DIR/<id>
    /// (the bundle has no report, so the run ends with exit 2 saying so).
    func testRunCommandFetchesAValidRunsBundle() async throws {
        let plan = try planFile()
        let token = try tokenFile()
        let id = "r20260101-0010"
        let bundle = try archive([.file("\(id)/manifest.json", "{}")])
        coordinator.answer(record: Self.record(id: id, sha: SHA256.hash(bundle)), bundle: bundle)
        let (code, output) = try await run([plan, "--coordinator", "http://127.0.0.1:\(coordinator.port)", "--token-file", token, "--out", dir.path])
        XCTAssertEqual(code, 2, output)
        XCTAssertTrue(output.contains("run \(id) submitted"), output)
        XCTAssertTrue(output.contains("bundle: \(dir.appendingPathComponent(id).path)"), output)
        XCTAssertTrue(output.contains("the bundle has no report"), output)
        XCTAssertEqual(coordinator.requests, ["POST /v1/runs?name=hostile.yaml", "GET /v1/runs/\(id)", "GET /v1/runs/\(id)/bundle"])
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: dir.path).sorted(), [id, "\(id).tar.gz"])
        XCTAssertEqual(try Data(contentsOf: dir.appendingPathComponent("\(id)/manifest.json")), Data("{}".utf8))
    }

    // MARK: Helpers

    /// A run record as GET /v1/runs/:id serves it: complete, no nodes.
    static func record(id: String, sha: String?) -> Data {
        var r: [String: Any] = ["id": id, "plan": "hostile", "planText": "name: hostile\n", "state": "complete", "created": 1.7e9,
                                "duration": 10.0, "warmup": 2.0, "nodes": [[String: Any]]()]
        if let sha { r["bundleSha256"] = sha }
        return try! JSONSerialization.data(withJSONObject: r)
    }

    /// What `snapshot` shows of an archive fetched and unpacked as `path` (from root).
    static func unpacked(as path: String, archive: Data, manifest: String, summary: String) -> [String: String] {
        [
            "\(path).tar.gz": "file " + SHA256.hash(archive),
            path: "folder",
            "\(path)/manifest.json": "file " + SHA256.hash(Data(manifest.utf8)),
            "\(path)/report": "folder",
            "\(path)/report/summary.json": "file " + SHA256.hash(Data(summary.utf8)),
        ]
    }

    /// Every entry under `root`, links not followed: its path from root and what it is (a
    /// folder, a file with its SHA-256, a link with its target).
    func snapshot() throws -> [String: String] {
        var out = [String: String]()
        func walk(_ url: URL, _ relative: String) throws {
            for name in try FileManager.default.contentsOfDirectory(atPath: url.path) {
                let child = url.appendingPathComponent(name)
                let path = relative.isEmpty ? name : "\(relative)/\(name)"
                var st = stat()
                guard lstat(child.path, &st) == 0 else { out[path] = "gone"; continue }
                switch st.st_mode & S_IFMT {
                case S_IFDIR: out[path] = "folder"; try walk(child, path)
                case S_IFREG: out[path] = "file " + SHA256.hash(try Data(contentsOf: child))
                case S_IFLNK: out[path] = "link -> " + ((try? FileManager.default.destinationOfSymbolicLink(atPath: child.path)) ?? "?")
                default: out[path] = "other"
                }
            }
        }
        try walk(root, "")
        return out
    }

    /// The error `body` throws, as its text; a failure when it throws none.
    func refusal(_ what: String, file: StaticString = #filePath, line: UInt = #line, _ body: () async throws -> URL) async -> String {
        do {
            let url = try await body()
            XCTFail("\(what): fetched into \(url.path) instead of refusing", file: file, line: line)
            return ""
        } catch {
            return "\(error)"
        }
    }

    /// No character in `text` that acts on a terminal or forges a line (line breaks allowed
    /// when `lines`: the command's output has several).
    func assertPrintable(_ text: String, _ what: String, lines: Bool = false, file: StaticString = #filePath, line: UInt = #line) {
        let raw = text.unicodeScalars.filter { OutsideText.isEscaped($0) && !(lines && $0 == "\n") }
        XCTAssertTrue(raw.isEmpty, "\(what): raw \(raw.map { String(format: "U+%04X", $0.value) }) in \(OutsideText.escaped(text))", file: file, line: line)
    }

    enum Member {
        case file(String, String)
        case data(String, Data)
        case link(String, to: String)
    }

    /// A .tar.gz whose members have exactly the names given, in order (GNU tar with -P keeps a
    /// leading `/` and `..` as a hostile server would write them).
    func archive(_ members: [Member]) throws -> Data {
        let source = scratch.appendingPathComponent("archive-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: source, withIntermediateDirectories: true)
        let output = source.appendingPathExtension("tar.gz")
        var arguments = ["-czPf", output.path, "-C", source.path, "--no-recursion", "--owner=0", "--group=0", "--numeric-owner"]
        var operands = [String]()
        for (i, m) in members.enumerated() {
            let local = "m\(i)", at = source.appendingPathComponent("m\(i)")
            let name: String
            switch m {
            case .file(let n, let text): name = n; try Data(text.utf8).write(to: at)
            case .data(let n, let data): name = n; try data.write(to: at)
            case .link(let n, let target): name = n; try FileManager.default.createSymbolicLink(atPath: at.path, withDestinationPath: target)
            }
            arguments.append("--transform=s,^\(local)$,\(name),")
            operands.append(local)
        }
        let tar = Process()
        tar.executableURL = URL(fileURLWithPath: "/bin/tar")
        tar.arguments = arguments + ["--"] + operands
        tar.standardError = FileHandle.nullDevice
        try tar.run()
        tar.waitUntilExit()
        guard tar.terminationStatus == 0 else { throw CocoaError(.fileWriteUnknown, userInfo: [NSLocalizedDescriptionKey: "tar \(arguments) exited \(tar.terminationStatus)"]) }
        return try Data(contentsOf: output)
    }

    func planFile() throws -> String {
        let file = scratch.appendingPathComponent("hostile.yaml")
        try "name: hostile\nduration: 10s\nwarmup: 2s\nnodes:\n  - {name: n1, position: [0, 0]}\n  - {name: n2, position: [1, 0]}\n"
            .write(to: file, atomically: true, encoding: .utf8)
        return file.path
    }

    func tokenFile() throws -> String {
        let file = scratch.appendingPathComponent("operator.token")
        try (LabToken.generate() + "\n").write(to: file, atomically: true, encoding: .utf8)
        return file.path
    }

    /// `herald-lab run ARGUMENTS` in this process: its exit code (0 when it returned) and what
    /// it wrote to stdout and stderr (both sent to one file while it runs).
    func run(_ arguments: [String]) async throws -> (code: Int32, output: String) {
        let command = try RunCommand.parse(arguments)
        let file = scratch.appendingPathComponent("output-\(UUID().uuidString)")
        let fd = open(file.path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw POSIXError(.EIO) }
        fflush(nil)
        let (savedOut, savedErr) = (dup(1), dup(2))
        dup2(fd, 1)
        dup2(fd, 2)
        close(fd)
        var code: Int32 = 0
        do { try await command.run() } catch { code = (error as? ExitCode)?.rawValue ?? -1 }
        fflush(nil)
        dup2(savedOut, 1)
        dup2(savedErr, 2)
        close(savedOut)
        close(savedErr)
        return (code, try String(contentsOf: file, encoding: .utf8))
    }
}

/// A coordinator that says what the test tells it to, over plain sockets on 127.0.0.1: GET
/// .../bundle gets `bundle` as application/gzip (its whole Content-Length, but only the first
/// `cut` bytes sent when set, then the connection closed); every other request gets `record`
/// (201 to a POST; a GET gets `followed` instead when set). One request per connection (`Connection: close`), each on a
/// thread of its own; every request line is kept.
final class HostileCoordinator: @unchecked Sendable {
    let port: UInt16
    private let listener: Int32
    private let lock = NSLock()
    private var record = Data()
    private var followed: Data?
    private var bundle = Data()
    private var cut: Int?
    private var seen = [String]()

    init() throws {
        let (fd, port) = try Listener.listen(host: "127.0.0.1", port: 0)
        (listener, self.port) = (fd, port)
        Thread { [self] in
            while let c = Listener.accept(fd) { Thread { self.serve(c) }.start() }
        }.start()
    }

    /// What the next requests are answered; the requests seen are forgotten.
    func answer(record: Data, bundle: Data, cut: Int? = nil, followed: Data? = nil) {
        lock.withLock { (self.record, self.followed, self.bundle, self.cut, seen) = (record, followed, bundle, cut, []) }
    }

    /// "METHOD target" of each request since `answer`, in the order they came.
    var requests: [String] { lock.withLock { seen } }

    /// Wakes the accepting thread (shutdown), which then ends.
    func stop() {
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
    }

    private func serve(_ c: Int32) {
        defer { close(c) }
        // The request to its end, body included (closing with bytes unread would send a reset).
        var data = [UInt8]()
        var buffer = [UInt8](repeating: 0, count: 4096)
        func receive() -> Bool {
            let n = buffer.withUnsafeMutableBytes { recv(c, $0.baseAddress!, $0.count, 0) }
            if n <= 0 { return false }
            data += buffer[0..<n]
            return true
        }
        var headEnd: Int?
        while headEnd == nil {
            guard receive() else { return }
            headEnd = data.indices.dropLast(3).first { data[$0] == 13 && data[$0 + 1] == 10 && data[$0 + 2] == 13 && data[$0 + 3] == 10 }
        }
        let head = String(decoding: data[..<headEnd!], as: UTF8.self).components(separatedBy: "\r\n")
        let length = head.dropFirst().compactMap { field -> Int? in
            let parts = field.split(separator: ":", maxSplits: 1)
            guard parts.count == 2, parts[0].lowercased() == "content-length" else { return nil }
            return Int(parts[1].trimmingCharacters(in: .whitespaces))
        }.first ?? 0
        while data.count < headEnd! + 4 + length { guard receive() else { return } }
        let words = head[0].split(separator: " ")
        let (method, target) = words.count >= 2 ? (String(words[0]), String(words[1])) : ("?", "?")
        let (record, bundle, cut) = lock.withLock { () -> (Data, Data, Int?) in
            seen.append("\(method) \(target)")
            return (method == "GET" ? followed ?? self.record : self.record, self.bundle, self.cut)
        }
        if method == "GET" && target.hasSuffix("/bundle") {
            let answer = "HTTP/1.1 200 OK\r\nContent-Type: application/gzip\r\nContent-Length: \(bundle.count)\r\nConnection: close\r\n\r\n"
            send(c, Data(answer.utf8) + bundle.prefix(cut ?? bundle.count))
        } else {
            let status = method == "POST" ? "201 Created" : "200 OK"
            send(c, Data("HTTP/1.1 \(status)\r\nContent-Type: application/json\r\nContent-Length: \(record.count)\r\nConnection: close\r\n\r\n".utf8) + record)
        }
    }

    private func send(_ c: Int32, _ answer: Data) {
        answer.withUnsafeBytes { raw in
            var off = 0
            while off < raw.count {
                let n = Glibc.send(c, raw.baseAddress! + off, raw.count - off, Int32(MSG_NOSIGNAL))
                if n <= 0 { return }
                off += n
            }
        }
    }
}
