// swift-tools-version:6.0
// HeraldLab: a test lab for the Herald BLE proximity protocol.
// Module map (what each may depend on) is in ARCHITECTURE.md.
import PackageDescription

let package = Package(
    name: "HeraldLab",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "herald-lab", targets: ["HeraldLabCLI"]),
        // The harness benchmarks (make bench), out of the product herald-lab.
        .executable(name: "herald-lab-bench", targets: ["HeraldLabBench"]),
        .library(name: "HeraldSensor", targets: ["HeraldSensor"]),
        .library(name: "HeraldAnalysis", targets: ["HeraldAnalysis"]),
        .library(name: "LabNode", targets: ["LabNode"]),
        .library(name: "LabAgent", targets: ["LabAgent"]),
        .library(name: "LabCoordinator", targets: ["LabCoordinator"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/jpsim/Yams", from: "6.2.2"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
        .package(url: "https://github.com/apple/swift-crypto", "3.12.3"..<"5.0.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.3"),
        .package(url: "https://github.com/apple/swift-nio-ssl", from: "2.37.6"),
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1"),
        .package(url: "https://github.com/apple/swift-http-types", from: "1.8.0"),
        .package(url: "https://github.com/apple/swift-nio-extras", from: "1.35.2"),
        .package(url: "https://github.com/apple/swift-certificates", from: "1.21.1"),
        .package(url: "https://github.com/apple/swift-asn1", from: "1.7.4"),
        .package(url: "https://github.com/vapor/postgres-nio.git", from: "1.33.2"),
        .package(url: "https://github.com/hummingbird-project/swift-mustache", from: "2.1.1"),
    ],
    targets: [
        // MARK: The release and the commit a binary was built from (a build-time plugin writes the commit).
        .target(name: "LabBuildInfo", plugins: ["BuildInfoPlugin"]),
        .plugin(name: "BuildInfoPlugin", capability: .buildTool()),
        // MARK: A service's metrics: swift-metrics handles in a swift-prometheus registry, for GET /metrics.
        .target(name: "LabMetrics", dependencies: ["LabBuildInfo", .product(name: "CoreMetrics", package: "swift-metrics"),
                                                   .product(name: "Prometheus", package: "swift-prometheus")]),
        // MARK: Herald protocol: types, payloads, codecs (no dependencies).
        .target(name: "HeraldCore", dependencies: [.product(name: "Crypto", package: "swift-crypto")]),
        // SHA-256's compression function in C: SHA-NI where the CPU has it, portable C otherwise.
        // MARK: Service logging: swift-log's Logger, one stderr line per event, outside text escaped (OutsideText).
        .target(name: "LabLog", dependencies: ["HeraldCore", .product(name: "Logging", package: "swift-log")]),
        // MARK: Radio abstraction: the one transport protocol the sensor uses, clocks, schedulers.
        .target(name: "HeraldRadio", dependencies: ["HeraldCore"]),
        // MARK: Herald-format log files.
        .target(name: "HeraldLogs", dependencies: ["HeraldCore", "HeraldRadio"]),
        // MARK: The Herald sensor engine (Android-like), over HeraldRadio only.
        .target(name: "HeraldSensor", dependencies: ["HeraldCore", "HeraldRadio"]),
        // MARK: Simulated radio: propagation model, virtual-time medium, simulated transport.
        .target(name: "RadioSim", dependencies: ["HeraldCore", "HeraldRadio"]),
        // MARK: Test plans (YAML) and the results bundle manifest.
        .target(name: "LabPlan", dependencies: ["HeraldCore", "LabBuildInfo", .product(name: "Yams", package: "Yams")]),
        // MARK: One lab node (sensor + loggers over a transport) and the virtual-time simulation of a plan.
        .target(name: "LabNode", dependencies: ["HeraldCore", "HeraldRadio", "HeraldLogs", "HeraldSensor", "RadioSim", "LabPlan"]),
        // MARK: Analysis of Herald log folders and bundles; run history in SQLite.
        .target(name: "HeraldAnalysis", dependencies: ["HeraldCore"]),
        .target(name: "LabHistory", dependencies: ["HeraldAnalysis", .product(name: "GRDB", package: "GRDB.swift")]),
        // MARK: The results store many labs share, on PostgreSQL (postgres-nio), and the durable outbox in front of it (issue 41).
        .target(name: "LabResults", dependencies: ["HeraldCore", "HeraldAnalysis", "LabHistory", .product(name: "PostgresNIO", package: "postgres-nio"),
                                                   .product(name: "NIOCore", package: "swift-nio"), .product(name: "NIOPosix", package: "swift-nio"),
                                                   .product(name: "NIOSSL", package: "swift-nio-ssl"), .product(name: "Logging", package: "swift-log")]),
        // MARK: Addresses (names, IPv4, IPv6) and TLS: TLSContext on swift-nio-ssl, the lab CA on swift-certificates (X509, swift-crypto's keys); key files written with HeraldCore's Durable.
        .target(name: "LabNet", dependencies: ["HeraldCore", .product(name: "NIOCore", package: "swift-nio"), .product(name: "NIOSSL", package: "swift-nio-ssl"),
                                               .product(name: "X509", package: "swift-certificates"), .product(name: "SwiftASN1", package: "swift-asn1"),
                                               .product(name: "Crypto", package: "swift-crypto")]),
        // MARK: HTTP plumbing shared by agent and coordinator (HTTPService on Hummingbird 2; LabClient on AsyncHTTPClient; auth).
        .target(name: "LabHTTP", dependencies: ["HeraldCore", "LabNet", "LabPlan", "CLinuxEvents", .product(name: "Logging", package: "swift-log"),
                                                   .product(name: "Hummingbird", package: "hummingbird"), .product(name: "HummingbirdCore", package: "hummingbird"),
                                                   .product(name: "HTTPTypes", package: "swift-http-types"), .product(name: "NIOHTTPTypes", package: "swift-nio-extras"),
                                                   .product(name: "NIOHTTPTypesHTTP1", package: "swift-nio-extras"),
                                                   .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                                                   .product(name: "AsyncHTTPClient", package: "async-http-client"), .product(name: "NIOCore", package: "swift-nio"),
                                                   .product(name: "NIOHTTP1", package: "swift-nio"), .product(name: "NIOPosix", package: "swift-nio"),
                                                   .product(name: "NIOSSL", package: "swift-nio-ssl")]),
        .systemLibrary(name: "CLinuxEvents"),
        // MARK: The lab's ports (AgentLink, CoordinatorLink) and their HTTP adapters.
        .target(name: "LabLink", dependencies: ["HeraldCore", "LabPlan", "LabHTTP"]),
        // MARK: Real-time simulated radio medium for many processes (herald-lab air).
        .target(name: "RadioAir", dependencies: ["HeraldCore", "HeraldRadio", "RadioSim", "LabNet", .product(name: "Logging", package: "swift-log"),
                                                  .product(name: "NIOCore", package: "swift-nio"), .product(name: "NIOPosix", package: "swift-nio"), .product(name: "NIOTLS", package: "swift-nio"),
                                                  .product(name: "NIOSSL", package: "swift-nio-ssl")]),
        // MARK: Agent (runs a node on a Linux machine) and coordinator (plans, barrier, gather).
        .target(name: "LabAgent", dependencies: ["LabMetrics", "HeraldCore", "HeraldRadio", "LabNode", "LabPlan", "LabHTTP", "LabLink", "LabNet", "RadioAir", "RadioSim", "BlueZRadio", .product(name: "Logging", package: "swift-log"), .product(name: "Hummingbird", package: "hummingbird")]),
        .target(name: "LabCoordinator", dependencies: ["LabMetrics", "HeraldCore", "LabPlan", "LabHTTP", "LabLink", "LabNet", "RadioAir", "HeraldAnalysis", "LabHistory", .product(name: "GRDB", package: "GRDB.swift"), .product(name: "Yams", package: "Yams"), .product(name: "Logging", package: "swift-log"),
                                                      .product(name: "Mustache", package: "swift-mustache"), .product(name: "Hummingbird", package: "hummingbird")],
                // The dashboard's pages (Mustache templates, escaping by default), its CSS and its scripts (ARCHITECTURE.md).
                resources: [.copy("Dashboard")]),
        // MARK: BlueZ over D-Bus (libdbus) and controller identity (libbluetooth).
        .systemLibrary(name: "CDBus", pkgConfig: "dbus-1", providers: [.apt(["libdbus-1-dev"])]),
        .target(name: "DBus", dependencies: ["CDBus"]),
        .systemLibrary(name: "CBluetooth", pkgConfig: "bluez", providers: [.apt(["libbluetooth-dev"])]),
        .target(name: "BlueZRadio", dependencies: ["HeraldCore", "HeraldRadio", "DBus", "CBluetooth"]),
        // MARK: The herald-lab command.
        .executableTarget(name: "HeraldLabCLI", dependencies: [
            "LabBuildInfo", "LabNode", "LabPlan", "HeraldLogs", "HeraldAnalysis", "LabHistory", "LabResults", "LabAgent", "LabCoordinator", "RadioAir", "RadioSim", "LabHTTP", "LabNet", "BlueZRadio", "LabLog",
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
            .product(name: "Logging", package: "swift-log"),
            .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
        ]),
        // MARK: The harness benchmarks (herald-lab-bench arm|gather|hash; make bench) and the calibration
        // loops (herald-lab-bench calibrate; make test-calibration): not in the product.
        .executableTarget(name: "HeraldLabBench", dependencies: [
            "HeraldCore", "LabAgent", "LabCoordinator", "LabHTTP", "LabPlan", "RadioAir", "RadioSim", "HeraldAnalysis", "LabHistory", "LabNode", "LabResults",
            .product(name: "ArgumentParser", package: "swift-argument-parser"), .product(name: "Logging", package: "swift-log"),
        ]),

        // MARK: Tests mirror the modules one to one; end-to-end tests start real processes.
        .testTarget(name: "HeraldCoreTests", dependencies: ["HeraldCore"]),
        // Tests' log capture (a LogHandler that keeps each event and its line as LabLogHandler writes it),
        // and their blocking TCP/TLS stream and server on swift-nio and swift-nio-ssl.
        .target(name: "LabTestSupport", dependencies: ["LabLog", "LabNet", "HeraldCore", "HeraldRadio", .product(name: "Logging", package: "swift-log"),
                                                       .product(name: "NIOCore", package: "swift-nio"), .product(name: "NIOPosix", package: "swift-nio"),
                                                       .product(name: "NIOTLS", package: "swift-nio"), .product(name: "NIOSSL", package: "swift-nio-ssl")],
                path: "Tests/LabTestSupport"),
        .testTarget(name: "LabLogTests", dependencies: ["LabLog", "LabTestSupport", .product(name: "Logging", package: "swift-log")]),
        .testTarget(name: "HeraldLogsTests", dependencies: ["HeraldLogs", "HeraldCore"]),
        .testTarget(name: "HeraldSensorTests", dependencies: ["HeraldSensor", "RadioSim", "HeraldRadio", "HeraldCore", "HeraldLogs"]),
        .testTarget(name: "RadioSimTests", dependencies: ["RadioSim", "HeraldRadio", "HeraldCore"]),
        .testTarget(name: "LabPlanTests", dependencies: ["LabPlan"]),
        .testTarget(name: "LabNodeTests", dependencies: ["LabNode", "LabPlan", "HeraldCore", "HeraldRadio", "HeraldLogs", "HeraldSensor", "RadioSim"]),
        .testTarget(name: "HeraldAnalysisTests", dependencies: ["HeraldAnalysis", "LabHistory", "LabNode", "LabPlan"]),
        .target(name: "DBusTestSupport", path: "Tests/DBusTestSupport"),
        .testTarget(name: "DBusTests", dependencies: ["DBus", "DBusTestSupport"]),
        .testTarget(name: "BlueZRadioTests", dependencies: ["BlueZRadio", "DBus", "DBusTestSupport", "HeraldRadio", "HeraldCore", "HeraldSensor", "LabNode", "LabPlan", "LabAgent", "LabTestSupport"],
                    exclude: ["fake_bluetoothd.py"]),
        .testTarget(name: "LabCoordinatorTests", dependencies: [.product(name: "Hummingbird", package: "hummingbird"), "LabCoordinator", "LabLink", "HeraldCore", "LabPlan", "LabHTTP", "LabNode", "HeraldAnalysis", "LabHistory", "LabTestSupport", .product(name: "GRDB", package: "GRDB.swift")]),
        .testTarget(name: "LabNetTests", dependencies: [.product(name: "Hummingbird", package: "hummingbird"), "LabNet", "LabHTTP", "HeraldCore", "LabTestSupport", .product(name: "X509", package: "swift-certificates"),
                                                      .product(name: "SwiftASN1", package: "swift-asn1"), .product(name: "Crypto", package: "swift-crypto"),
                                                      .product(name: "NIOCore", package: "swift-nio"), .product(name: "NIOEmbedded", package: "swift-nio"),
                                                      .product(name: "NIOSSL", package: "swift-nio-ssl")]),
        .testTarget(name: "LabHTTPTests", dependencies: ["LabHTTP", "LabNet", "LabPlan", "LabTestSupport", .product(name: "Hummingbird", package: "hummingbird"), .product(name: "HummingbirdTesting", package: "hummingbird"), .product(name: "NIOCore", package: "swift-nio"),
                                                       .product(name: "NIOEmbedded", package: "swift-nio"), .product(name: "NIOHTTP1", package: "swift-nio")]),
        .testTarget(name: "LabHarnessTests", dependencies: [.product(name: "HummingbirdTesting", package: "hummingbird"), .product(name: "Hummingbird", package: "hummingbird"), "LabAgent", "LabNode", "LabCoordinator", "LabLink", "LabHTTP", "LabNet", "RadioAir", "LabPlan", "HeraldCore", "HeraldRadio", "RadioSim", "LabTestSupport", .product(name: "NIOCore", package: "swift-nio")]),
        // Against a real PostgreSQL the test starts (make test-results-server).
        .testTarget(name: "LabResultsTests", dependencies: [.product(name: "Hummingbird", package: "hummingbird"), "LabResults", "HeraldAnalysis", "LabHistory", "LabNode", "LabPlan", "LabNet", "LabCoordinator", "LabHTTP", "LabTestSupport", .product(name: "PostgresNIO", package: "postgres-nio")]),
        // The command's own functions (its texts of durations from a coordinator's records), and
        // its client against a hostile coordinator (a socket server in the test process).
        .testTarget(name: "HeraldLabCLITests", dependencies: ["HeraldLabCLI", "HeraldCore", "LabHistory", "LabPlan", "LabCoordinator", "LabHTTP", "LabNet", "LabTestSupport",
                                                            .product(name: "ArgumentParser", package: "swift-argument-parser")]),
    ]
)
