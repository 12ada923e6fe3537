import XCTest
@testable import HeraldAnalysis

/// Herald's published formal test of 2020-12-08 must give exactly the published numbers.
final class FixtureTests: XCTestCase {
    nonisolated(unsafe) static var cached: AnalysisReport?

    func analyse() throws -> AnalysisReport {
        if let r = Self.cached { return r }
        guard let folder = TestPaths.unpackedFixture else {
            throw XCTSkip("fixture not found at \(TestPaths.fixture.path)")
        }
        var o = AnalysisOptions()
        o.ceStart = AnalysisTime.parse("2020-12-08 23:20:00")
        o.ceEnd = AnalysisTime.parse("2020-12-09 11:00:00")
        o.filterStart = AnalysisTime.parse("2020-12-08 23:00:00")
        o.filterEnd = AnalysisTime.parse("2020-12-09 11:20:00")
        let r = try Analyser.analyse(folder, options: o)
        Self.cached = r
        return r
    }

    func testHeraldModeReproducesThePublishedFigures() throws {
        let h = try analyse().result.herald
        XCTAssertEqual(h.phonescount, 4)
        XCTAssertEqual(h.maxpairs, 12)
        XCTAssertEqual(h.achieveddetections, 12)
        XCTAssertEqual(h.detectionpct, 100)
        XCTAssertEqual(h.maxwindows, 16800)
        XCTAssertEqual(h.achievedwindows, 16799)
        XCTAssertEqual(h.deltacewindowspct, 0.00595, accuracy: 0.000005)
        XCTAssertEqual(h.longevity, 0.1389, accuracy: 0.00005)
    }

    func testHeraldModePerPairValues() throws {
        let r = try analyse().result
        XCTAssertEqual(r.herald.pairs.count, 12)
        for p in r.herald.pairs {
            switch (p.observer, p.observed) {
            case ("3 - Denmark - iOS 12.1.4", "2 - SM-A202F - Android 29"):
                XCTAssertEqual(p.windows, 1401); XCTAssertEqual(p.scorePct, 100.0714, accuracy: 0.0001)
            case ("4 - Netherlands - iOS 12.4.5", "3 - Denmark - iOS 12.1.4"):
                XCTAssertEqual(p.windows, 1398); XCTAssertEqual(p.scorePct, 99.857, accuracy: 0.001)
            default:
                XCTAssertEqual(p.windows, 1400, "\(p.observer) sees \(p.observed)")
            }
        }
    }

    func testHeraldCSVFilesMatchTheReferenceScriptsFormat() throws {
        let report = try analyse()
        let out = TestPaths.temp("fixture-report")
        defer { try? FileManager.default.removeItem(at: out) }
        try ReportWriter.write(report, to: out)
        let summary = try String(contentsOf: out.appendingPathComponent("formal-summary.csv"), encoding: .utf8)
        XCTAssertEqual(summary.split(separator: "\n").first, "\"\",\"phonescount\",\"maxpairs\",\"achieveddetections\",\"detectionpct\",\"maxwindows\",\"achievedwindows\",\"deltacewindowspct\",\"longevity\"")
        XCTAssertTrue(summary.contains("\"1\",4,12,12,100,16800,16799,0.00595238095237"), summary)
        let continuity = try String(contentsOf: out.appendingPathComponent("formal-continuity.csv"), encoding: .utf8)
        XCTAssertTrue(continuity.contains("\"8\",\"2 - SM-A202F - Android 29\",1401,\"3 - Denmark - iOS 12.1.4\",100.071428571429,-0.0714285714285"), continuity)
        let pairs = try String(contentsOf: out.appendingPathComponent("summary-discovery-pairs.csv"), encoding: .utf8)
        XCTAssertTrue(pairs.contains("\"3\",\"3 - Denmark - iOS 12.1.4\",TRUE,TRUE,NA,TRUE"), pairs)
    }

    func testStrictModeIsReportedBeside() throws {
        let s = try analyse().result.strict
        XCTAssertEqual(s.mode, .strict)
        XCTAssertEqual(s.achieveddetections, 12)
        XCTAssertLessThanOrEqual(s.achievedwindows, s.maxwindows, "aligned windows can never exceed 100%")
        XCTAssertGreaterThan(s.continuitypct, 99.9)
        XCTAssertTrue(s.pairs.allSatisfy { $0.windows <= 1400 })
    }
}
