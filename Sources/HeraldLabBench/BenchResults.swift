import ArgumentParser
import Foundation
import HeraldAnalysis
import LabHistory
import LabNode
import LabPlan
import LabResults
import Logging

/// `herald-lab-bench results --history postgres://OWNER@HOST:PORT/DB --history-password-file F`
/// (make bench-results, issue 41 item 6, on a PostgreSQL scripts/results-server/bench.sh starts):
/// the insert rate of 3 writers at once (one transaction a run, as coordinators write), then a
/// simulated year of 10 labs (10 labs x 20 plans x 365 nights = 73,000 runs, loaded in batches of
/// bound arrays) and the time of the Trends series and of `regress --baseline history`'s baseline
/// query over it. Figures, never asserted.
struct BenchResults: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "results", abstract: "The shared results store's insert rate (3 writers) and query times over a simulated 1-year, 10-lab history.")
    @Option(name: .customLong("history")) var history: String
    @Option(name: .customLong("history-password-file")) var passwordFile: String?
    @Option(help: "Runs each of the 3 writers stores (one transaction each).") var writerRuns = 500
    @Option(help: "Labs, plans and nights of the simulated history.") var labs = 10
    @Option var plans = 20
    @Option var nights = 365
    @Option(help: "Timings per query (the median is printed).") var repeats = 7

    func run() async throws {
        guard (1...100_000).contains(writerRuns), (1...100).contains(labs), (1...1000).contains(plans), (1...3650).contains(nights), (1...100).contains(repeats) else {
            log("herald-lab-bench results: --writer-runs 1 to 100000, --labs 1 to 100, --plans 1 to 1000, --nights 1 to 3650, --repeats 1 to 100")
            throw ExitCode(2)
        }
        let quiet = Logger(label: "bench.results") { _ in SwiftLogNoOpLogHandler() }
        func open() async throws -> SharedResultsStore { try await SharedResultsStore.connect(url: history, passwordFile: passwordFile, logger: quiet) }
        // One real analysed run (plans/smoke.yaml, simulated): the rows' identity, settings and figures.
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("heraldlab-bench-results-\(getpid())")
        defer { try? FileManager.default.removeItem(at: dir) }
        let smoke = "name: smoke\nduration: 60s\nwarmup: 2s\nnodes:\n  - name: alpha\n    position: [0, 0]\n  - name: beta\n    position: [1m, 0]\nradio:\n  kind: sim\n"
        _ = try Simulation(plan: try Plan.parse(yaml: smoke), planText: smoke, seed: 1, output: dir).run()
        let base = try Analyser.analyse(dir).result
        // The summary is stored verbatim; the history's rows carry a small one (73,000 full ones
        // would time the disk, not the queries).
        let small = "{\"bench\": true}"

        // 1. Three writers at once, each its own connection, a transaction a run (SharedResultsStore.record).
        let stores = try await [open(), open(), open()]
        var rows = [[SharedRun]]()
        for w in 0..<3 {
            rows.append(try (0..<writerRuns).map { k in
                var r = base
                r.input.runId = "writer-\(w)-\(k)"
                var row = try SharedRun(r, lab: "bench-writer-\(w)", at: Date(timeIntervalSince1970: 1_700_000_000 + Double(k)))
                row.summaryJSON = small
                return row
            })
        }
        let clock = ContinuousClock()
        let writeTime = try await clock.measure {
            try await withThrowingTaskGroup(of: Void.self) { group in
                for w in 0..<3 {
                    let (s, mine) = (stores[w], rows[w])
                    group.addTask { for row in mine { try await s.record(row) } }
                }
                try await group.waitForAll()
            }
        }
        let total = 3 * writerRuns
        print(String(format: "results: 3 writers x %d runs at once: %d runs in %.2f s = %.0f runs/s (one transaction a run)", writerRuns, total, writeTime.inSeconds, Double(total) / writeTime.inSeconds))
        for s in stores { await s.close() }

        // 2. A simulated year: every night each lab runs each plan once, on its own testbed.
        let store = try await open()
        let start = Date(timeIntervalSince1970: 1_767_225_600) // 2026-01-01 00:00 UTC
        // The run `regress --baseline history` judges: one lab's plan on its testbed. Every row
        // has its settings (the settings key is part of what makes runs each other's baseline).
        let plan = String(format: "plan-%02d", plans / 2)
        var like = base
        like.input.plan = plan
        like.input.testbed = "bench-03"
        like.input.runId = "the-new-run"
        let settings = HistoryStore.settingsKey(like)

        var year = [SharedRun]()
        year.reserveCapacity(labs * plans * nights)
        let template = try SharedRun(base, lab: "lab-00", at: start)
        for n in 0..<nights {
            for l in 0..<labs {
                for p in 0..<plans {
                    var row = template
                    row.lab = String(format: "lab-%02d", l)
                    row.plan = String(format: "plan-%02d", p)
                    row.testbed = String(format: "bench-%02d", l)
                    row.runId = String(format: "plan-%02d-night-%03d", p, n)
                    row.recordedAt = start.addingTimeInterval(Double(n) * 86_400 + Double(l * plans + p) * 30 + 3600)
                    row.detectionPct = 80 + Double((n * 7 + l * 3 + p) % 20)
                    row.continuityPct = 60 + Double((n * 5 + l + p * 3) % 30)
                    row.infra = (n + l + p) % 25 == 0 ? "node beta: state partial" : ""
                    row.summaryJSON = small
                    row.settingsKey = settings
                    year.append(row)
                }
            }
        }
        let loadTime = try await clock.measure { _ = try await store.recordBatch(year) }
        print(String(format: "results: loaded %d runs (%d labs x %d plans x %d nights) in %.1f s = %.0f runs/s (batches of 1,000 bound arrays)",
                     year.count, labs, plans, nights, loadTime.inSeconds, Double(year.count) / loadTime.inSeconds))
        try await store.analyse()
        let end = start.addingTimeInterval(Double(nights) * 86_400)

        func median(_ label: String, _ body: () async throws -> Int) async throws {
            var times = [Double](), count = 0
            for _ in 0..<repeats { times.append(try await clock.measure { count = try await body() }.inSeconds * 1000) }
            times.sort()
            print(String(format: "results: %@: %d rows, median %.1f ms (min %.1f, max %.1f; %d times)", label, count, times[times.count / 2], times[0], times[times.count - 1], repeats))
        }
        try await median("Trends, one plan across every lab, last 90 nights (nightlySeries)") {
            try await store.nightlySeries(plan: plan, since: end.addingTimeInterval(-90 * 86_400)).count
        }
        try await median("Trends, one plan of one lab, the whole year") {
            try await store.nightlySeries(plan: plan, labs: ["lab-03"], since: start).count
        }
        try await median("regress --baseline history, one lab's plan and testbed, last 30 (baseline)") {
            try await store.baseline(like: like, lab: "lab-03", last: 30).count
        }
        await store.close()
    }
}

extension Duration {
    var inSeconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}
