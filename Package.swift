// swift-tools-version:6.0
// Pylon: a Linux daemon that serves mobile-engagement SDK behaviour (MA analytics, push,
// tag manager) to local programs over a Unix-socket JSON-RPC bus.
import PackageDescription

/// Settings shared by every Swift target: Swift 6 language mode is the package default.
let strict: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
]

let package = Package(
    name: "Pylon",
    products: [
        .executable(name: "pylond", targets: ["pylond"]),
        .executable(name: "pylonctl", targets: ["pylonctl"]),
        .library(name: "PylonPluginKit", targets: ["PylonPluginKit"]),
        .library(name: "PylonClientKit", targets: ["PylonClientKit"]),
    ],
    targets: [
        // C libraries from Debian (installed by `make deps`): module maps and tiny typed shims only.
        .systemLibrary(name: "CLibUV", pkgConfig: "libuv", providers: [.apt(["libuv1-dev"])]),
        .systemLibrary(name: "CJSONC", pkgConfig: "json-c", providers: [.apt(["libjson-c-dev"])]),
        .systemLibrary(name: "CCurl", pkgConfig: "libcurl", providers: [.apt(["libcurl4-openssl-dev"])]),
        .systemLibrary(name: "CSQLite", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
        .systemLibrary(name: "CHTTPParser", providers: [.apt(["libhttp-parser-dev"])]),
        .systemLibrary(name: "CZlib", pkgConfig: "zlib", providers: [.apt(["zlib1g-dev"])]),
        // Native journal entries (sd_journal_sendv) when stderr is the journal.
        .systemLibrary(name: "CSystemd", pkgConfig: "libsystemd", providers: [.apt(["libsystemd-dev"])]),

        // Loop wrappers, framing, JSON, protocol types, logging. No Foundation.
        .target(name: "PylonCore", dependencies: ["CLibUV", "CJSONC", "CSystemd"], swiftSettings: strict),
        // The host's concerns: config, router, supervisor, consent.
        .target(name: "PylonHost", dependencies: ["PylonCore"], swiftSettings: strict),
        // What plugins and apps link.
        .target(name: "PylonPluginKit", dependencies: ["PylonCore"], swiftSettings: strict),
        .target(name: "PylonClientKit", dependencies: ["PylonCore"], swiftSettings: strict),
        // SQLite (durable queues and state) and gzip, shared by plugins and the backend.
        .target(name: "PylonStore", dependencies: ["CSQLite", "CZlib", "PylonCore"], swiftSettings: strict),
        // HTTP client: libcurl's multi-socket API driven by the process's libuv loop.
        .target(name: "PylonHTTP", dependencies: ["CCurl", "PylonCore"], swiftSettings: strict),

        // Thin executables.
        .executableTarget(name: "pylond", dependencies: ["PylonHost"], swiftSettings: strict),
        .executableTarget(name: "pylonctl", dependencies: ["PylonClientKit"], swiftSettings: strict),

        // `Plugins/` holds Pylon's plugin *executables* (services the host spawns), not SwiftPM
        // package plugins; each therefore names its `path:` explicitly.
        .executableTarget(
            name: "pylon-echo", dependencies: ["PylonPluginKit"], path: "Plugins/echo",
            swiftSettings: strict),

        .executableTarget(
            name: "pylon-uploader", dependencies: ["PylonPluginKit", "PylonStore", "PylonHTTP"],
            path: "Plugins/uploader", swiftSettings: strict),

        .executableTarget(
            name: "pylon-ma", dependencies: ["PylonPluginKit", "PylonStore", "PylonHTTP"],
            path: "Plugins/ma", swiftSettings: strict),

        // The reference backend: HTTP/1.1 on libuv with http-parser, SQLite storage, loopback.
        .executableTarget(
            name: "pylon-backend", dependencies: ["PylonCore", "PylonStore", "CHTTPParser", "CLibUV"],
            swiftSettings: strict),

        // Release-mode benchmark, run by hand (`make bench`).
        .executableTarget(
            name: "pylon-bench", dependencies: ["PylonClientKit", "PylonHTTP"], path: "Benchmarks/pylon-bench",
            swiftSettings: strict),

        .testTarget(name: "PylonCoreTests", dependencies: ["PylonCore"]),
        .testTarget(name: "PylonHostTests", dependencies: ["PylonHost"]),
        .target(name: "TestSupport", path: "Tests/TestSupport"),
        .testTarget(name: "IntegrationTests", dependencies: ["PylonClientKit", "TestSupport"]),
        .testTarget(name: "UploaderTests", dependencies: ["pylon-uploader"]),
        .testTarget(name: "MATests", dependencies: ["pylon-ma"]),
        .testTarget(name: "BackendTests", dependencies: ["PylonClientKit", "PylonStore", "TestSupport"]),
    ]
)
