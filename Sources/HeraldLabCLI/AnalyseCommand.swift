import ArgumentParser
import Foundation
import HeraldAnalysis
import HeraldCore
import LabHistory
import LabResults

/// `herald-lab analyse PATH ...`
struct AnalyseCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "analyse",
        abstract: "Herald-exact and strict efficacy figures, report.html, junit.xml and summary.json for a bundle or a folder of device folders.",
        discussion: "Exit 0 when the verdict is PASS, 1 when it is FAIL (the plan's thresholds), 2 on bad input or for a bundle of an aborted run (no verdict). The run is recorded in history.sqlite of --results (the path is said on standard error), and with --history postgres://… also in the shared results store as lab --lab (default: this machine's name), replacing that lab's row of the run if there is one."
    )

    @Argument(help: "A results bundle (with manifest.json) or a folder holding one folder per device.")
    var path: String

    @Option(help: "Report folder (default: the bundle's report/, or <folder>-report beside a plain folder).")
    var out: String?

    @Option(help: "Mode of the headline figures printed: herald (the reference script's numbers) or strict. Both are always written.")
    var mode: String = "strict"

    @Option(name: .customLong("ce-start"), help: "Contact-event start, YYYY-MM-DD HH:MM:SS in the logs' time base.")
    var ceStart: String?
    @Option(name: .customLong("ce-end"), help: "Contact-event end.")
    var ceEnd: String?
    @Option(name: .customLong("filter-start"), help: "Filter-window start (default: the contact-event start).")
    var filterStart: String?
    @Option(name: .customLong("filter-end"), help: "Filter-window end (default: the contact-event end).")
    var filterEnd: String?

    @Option(name: .customLong("timeshift"), help: "DEVICE=SECONDS: seconds to add to a device's times (folder name or shortName); repeatable.")
    var timeshifts: [String] = []

    @Option(help: "Results folder holding history.sqlite (default: $HERALDLAB_RESULTS or results).")
    var results: String?

    @Flag(name: .customLong("junit-pairs"), help: "junit.xml with one test case per pair and metric (default: per node and metric).")
    var junitPairs = false

    @Flag(help: "Print each metric with the devices as units and its 95 % interval.")
    var metrics = false

    @Flag(help: "Do not record the run in the history database.")
    var noHistory = false

    @OptionGroup var store: HistoryReadOptions

    @Option(help: ArgumentHelp("summary.json (the verdict, its checks and every figure) to FILE, or alone on standard output instead of the text summary with --json or --json -; the exit code is the same.", valueName: "FILE"))
    var json: String?

    @Flag(help: "Print how long each step took.")
    var timings = false

    func run() async throws {
        try store.check("analyse", most: 1)
        if noHistory, store.history != nil { log("herald-lab analyse: --no-history and --history: one or the other"); throw ExitCode(2) }
        // Connected first: a wrong URL, password or schema is said before the analysis; the
        // connection is closed on every way out.
        let shared = try await store.sharedStore("analyse")
        do { try await analyse(shared: shared) } catch {
            await shared?.close()
            throw error
        }
        await shared?.close()
    }

    func analyse(shared: SharedResultsStore?) async throws {
        guard let mode = AnalysisMode(rawValue: mode) else {
            log("--mode \"\(OutsideText.escaped(String(mode.prefix(32))))\": must be \(AnalysisMode.allCases.map(\.rawValue).joined(separator: " or "))\(CLIConventions.didYouMean(mode, among: AnalysisMode.allCases.map(\.rawValue)))"); throw ExitCode(2)
        }
        var options = AnalysisOptions()
        func time(_ flag: String, _ value: String?) throws -> Double? {
            guard let value else { return nil }
            guard let t = AnalysisTime.parse(value) else {
                log("\(flag) \"\(value.prefix(64))\": expected YYYY-MM-DD HH:MM:SS (a possible date and time, years 1970 to 9999)"); throw ExitCode(2)
            }
            return t
        }
        options.ceStart = try time("--ce-start", ceStart)
        options.ceEnd = try time("--ce-end", ceEnd)
        options.filterStart = try time("--filter-start", filterStart)
        options.filterEnd = try time("--filter-end", filterEnd)
        for s in timeshifts {
            let parts = s.split(separator: "=", maxSplits: 1).map(String.init)
            guard parts.count == 2, let v = Double(parts[1]) else { log("--timeshift \"\(s)\": expected DEVICE=SECONDS"); throw ExitCode(2) }
            if let problem = InputLimits.shiftProblem(v) { log("--timeshift \"\(s)\": \(problem)"); throw ExitCode(2) }
            options.timeshifts[parts[0]] = v
        }
        let input = URL(fileURLWithPath: path).standardizedFileURL
        let started = Date()
        let report: AnalysisReport
        do {
            report = try Analyser.analyse(input, options: options)
        } catch {
            log("herald-lab analyse: \(error)")
            throw ExitCode(2)
        }
        let analysed = Date()
        let outDir = out.map { URL(fileURLWithPath: $0) } ?? ReportWriter.defaultOutput(for: input, kind: report.result.input.kind)
        do {
            try ReportWriter.write(report, to: outDir, junitPerPair: junitPairs)
        } catch {
            log("herald-lab analyse: cannot write the report to \(outDir.path): \(error.localizedDescription)")
            throw ExitCode(2)
        }
        let written = Date()
        if !noHistory {
            let resultsDir = URL(fileURLWithPath: results ?? ProcessInfo.processInfo.environment["HERALDLAB_RESULTS"] ?? "results")
            let file = resultsDir.appendingPathComponent("history.sqlite")
            do {
                let store = try HistoryStore(url: file)
                try store.record(report.result, reportPath: outDir.path)
                // Said, since the default is ./results wherever the command stands (--no-history: none).
                log("history: recorded in \(file.standardizedFileURL.path)")
            } catch {
                log("warning: run not recorded in history (\(error)); the report is complete")
            }
            if let shared {
                do {
                    let stored = try await shared.record(try SharedRun(report.result, lab: store.lab), replace: true)
                    log("history: recorded in \(shared.location) as lab \(Format.label(store.lab)) (row \(stored.id))")
                } catch {
                    log("warning: run not recorded in the shared store \(shared.location) (\(error)); the report is complete")
                }
            }
        }
        if let json {
            let data: Data
            do { data = try ReportWriter.summaryJSON(report.result) } catch {
                log("herald-lab analyse: cannot encode summary.json: \(error)")
                throw ExitCode(2)
            }
            try CLIConventions.writeJSON(data, to: json, command: "analyse")
            if json == "-" {
                if report.result.input.aborted == true { throw ExitCode(2) }
                if !report.result.passed { throw ExitCode(1) }
                return
            }
        }
        print(Summary.text(report.result, mode: mode))
        if metrics { print(RunMetrics.table(RunMetrics.compute(report.result))) }
        print("report: \(outDir.appendingPathComponent("report.html").path)")
        if timings {
            let r = report.result
            let mb = Double(r.bytesRead) / 1_048_576
            print(String(format: "timings: analyse %.3f s (%.1f MB, %.0f MB/s), write %.3f s, total %.3f s; peak memory %.0f MB",
                         analysed.timeIntervalSince(started), mb, mb / max(analysed.timeIntervalSince(started), 1e-9),
                         written.timeIntervalSince(analysed), Date().timeIntervalSince(started), peakMemoryMB()))
        }
        // An aborted run has no verdict (issue 40): not a FAIL, not a pass either.
        if report.result.input.aborted == true { throw ExitCode(2) }
        // CI: a FAIL verdict is a failing step.
        if !report.result.passed { throw ExitCode(1) }
    }
}
