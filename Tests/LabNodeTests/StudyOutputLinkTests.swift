import Foundation
import XCTest
import HeraldCore
import LabNode
import LabPlan

/// A symbolic link placed in an output folder beforehand is not followed (issue 36): a study
/// whose folder, or one of whose run folders, is a link is refused naming it, and nothing is
/// written where the link points.
final class StudyOutputLinkTests: XCTestCase {
    let yaml = """
    name: linked
    duration: 10s
    nodes: {count: 2, prefix: n}
    radio: {kind: sim}
    study:
      factors:
        - {path: sensor.advertInterval, levels: [100ms, 1s]}
      repeats: 1
    """

    func testALinkedStudyOrRunFolderIsRefusedAndNothingIsWrittenThere() throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("links-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: root) }
        let out = root.appendingPathComponent("out"), elsewhere = root.appendingPathComponent("elsewhere")
        try FileManager.default.createDirectory(at: out, withIntermediateDirectories: true)
        try FileManager.default.createDirectory(at: elsewhere, withIntermediateDirectories: true)
        let (base, runs) = try Plan.expandStudy(yaml: yaml)
        let study = StudySimulation(plan: base, planText: yaml, runs: runs, output: out)
        // The study's own folder a link.
        try FileManager.default.createSymbolicLink(at: study.folder, withDestinationURL: elsewhere)
        XCTAssertThrowsError(try study.run { _, _ in }) { e in
            XCTAssertTrue("\(e)".contains("\(study.folder.path): is a symbolic link in the output folder"), "\(e)")
        }
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: elsewhere.path), [])
        // A run's folder a link inside a real study folder.
        try FileManager.default.removeItem(at: study.folder)
        try FileManager.default.createDirectory(at: study.folder, withIntermediateDirectories: true)
        let run = study.folder.appendingPathComponent(runs[1].folder)
        try FileManager.default.createSymbolicLink(at: run, withDestinationURL: elsewhere)
        XCTAssertThrowsError(try study.run { _, _ in }) { e in XCTAssertTrue("\(e)".contains(run.path), "\(e)") }
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: elsewhere.path), [])
        XCTAssertFalse(FileManager.default.fileExists(atPath: study.folder.appendingPathComponent(runs[0].folder).path), "refused before the first run")
        // Without links it runs.
        try FileManager.default.removeItem(at: run)
        var done = 0
        try study.run { _, _ in done += 1 }
        XCTAssertEqual(done, runs.count)
    }
}
