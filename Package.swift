// swift-tools-version:6.0
// Pylon: a Linux daemon that serves mobile-engagement SDK behaviour (MA analytics, push,
// tag manager) to local programs over a Unix-socket JSON-RPC bus.
import PackageDescription

/// Settings shared by every Swift target, tests included: Swift 6 language mode is the package
/// default; a warning fails the build.
let strict: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .unsafeFlags(["-warnings-as-errors"]),
]

let package = Package(
    name: "Pylon",
    products: [
        .executable(name: "pylond", targets: ["pylond"]),
        .executable(name: "pylonctl", targets: ["pylonctl"]),
        .executable(name: "pylon-uploader", targets: ["pylon-uploader-main"]),
        .executable(name: "pylon-ma", targets: ["pylon-ma-main"]),
        .executable(name: "pylon-push", targets: ["pylon-push-main"]),
        .executable(name: "pylon-gtm", targets: ["pylon-gtm-main"]),
        .executable(name: "pylon", targets: ["pylon"]),
        .library(name: "PylonPluginKit", targets: ["PylonPluginKit"]),
        .library(name: "PylonClientKit", targets: ["PylonClientKit"]),
        // Private hosts and fakes for apps' tests (docs/TESTING-APPS.md).
        .library(name: "PylonTesting", targets: ["PylonTesting"]),
    ],
    targets: [
        // C libraries from Debian (installed by `make deps`): module maps and tiny typed shims only.
        .systemLibrary(name: "CLibUV", pkgConfig: "libuv", providers: [.apt(["libuv1-dev"])]),
        .systemLibrary(name: "CJSONC", pkgConfig: "json-c", providers: [.apt(["libjson-c-dev"])]),
        // libcurl and libmosquitto: headers only, no pkg-config (its -lcurl / -lmosquitto): the
        // programs open them on first use through CLazyLink.
        .systemLibrary(name: "CCurl", providers: [.apt(["libcurl4-openssl-dev"])]),
        .systemLibrary(name: "CSQLite", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
        .systemLibrary(name: "CHTTPParser", providers: [.apt(["libhttp-parser-dev"])]),
        .systemLibrary(name: "CZlib", pkgConfig: "zlib", providers: [.apt(["zlib1g-dev"])]),
        .systemLibrary(name: "CMosquitto", providers: [.apt(["libmosquitto-dev"])]),
        .systemLibrary(name: "CPCRE2", pkgConfig: "libpcre2-8", providers: [.apt(["libpcre2-dev"])]),
        .systemLibrary(name: "CPlist", pkgConfig: "libplist-2.0", providers: [.apt(["libplist-dev"])]),
        // Native journal entries (sd_journal_sendv) when stderr is the journal.
        .systemLibrary(name: "CSystemd", pkgConfig: "libsystemd", providers: [.apt(["libsystemd-dev"])]),
        // The fleet's server side: PostgreSQL (libpq) for shared state, NATS JetStream (libnats,
        // with its libuv adapter) for the ingest stream.
        .systemLibrary(name: "CPQ", pkgConfig: "libpq", providers: [.apt(["libpq-dev"])]),
        .systemLibrary(name: "CNATS", pkgConfig: "libnats", providers: [.apt(["libnats-dev"])]),
        // libnats's libuv adapter, compiled once (its header defines non-static functions).
        .target(name: "CNATSLoop", dependencies: ["CNATS", "CLibUV"]),
        // ed25519 for the NATS JWTs the backend mints as device broker credentials (libcrypto).
        .systemLibrary(name: "CCrypto", pkgConfig: "libcrypto", providers: [.apt(["libssl-dev"])]),

        // Loop wrappers, framing, JSON, protocol types, logging. No Foundation.
        .target(name: "PylonCore", dependencies: ["CLibUV", "CJSONC", "CSystemd"], swiftSettings: strict),
        // The wire protocol, for every side: JSON-RPC envelopes, error codes, the bus.hello
        // manifest and welcome, host method names and topics.
        .target(name: "PylonProtocol", dependencies: ["PylonCore", "CJSONC"], swiftSettings: strict),
        // The host's concerns: config, router, supervisor, consent.
        .target(name: "PylonHost", dependencies: ["PylonCore", "PylonProtocol"], swiftSettings: strict),
        // What plugins and apps link.
        .target(name: "PylonPluginKit", dependencies: ["PylonCore", "PylonProtocol"], swiftSettings: strict),
        .target(name: "PylonClientKit", dependencies: ["PylonCore", "PylonProtocol"], swiftSettings: strict),
        // SQLite (durable queues and state) and gzip, shared by plugins and the backend.
        .target(name: "PylonStore", dependencies: ["CSQLite", "CZlib", "PylonCore"], swiftSettings: strict),
        // libcurl and libmosquitto opened on first use (dlopen), not at exec: CCurl and CMosquitto
        // are headers only, these functions stand in for the libraries (one target each, so a
        // program names only the libraries it can open). A process maps curl's tree (OpenSSL,
        // GnuTLS, Kerberos, LDAP, …) only once it makes a request (docs/BENCHMARKS.md, "Footprint").
        .target(name: "CLazyLink"),
        .target(name: "CLazyCurl", dependencies: ["CCurl", "CLazyLink"]),
        .target(name: "CLazyMosquitto", dependencies: ["CMosquitto", "CLazyLink"]),
        // HTTP client: libcurl's multi-socket API driven by the process's libuv loop.
        .target(name: "PylonHTTP", dependencies: ["CCurl", "CLazyCurl", "PylonCore"], swiftSettings: strict),
        // MQTT client: libmosquitto driven by the process's libuv loop (push plugin and backend).
        .target(name: "PylonMQTT", dependencies: ["CMosquitto", "CLazyMosquitto", "CLibUV", "PylonCore"], swiftSettings: strict),

        // The tag-manager engine: parse a container once, evaluate macros, rules and tags. No I/O.
        // Evaluation state is confined to one call on one thread: the dynamic exclusivity checks
        // of its class were a fifth of a push's CPU, so they are compiled out here only.
        .target(
            name: "PylonTagEngine", dependencies: ["PylonCore", "CJSONC", "CPCRE2"],
            swiftSettings: strict + [.unsafeFlags(["-enforce-exclusivity=unchecked"])]),

        // Thin executables.
        .executableTarget(name: "pylond", dependencies: ["PylonHost"], swiftSettings: strict),
        .executableTarget(name: "pylonctl", dependencies: ["PylonClientKit", "PylonProtocol"], swiftSettings: strict),

        // `Plugins/` holds Pylon's plugin *executables* (services the host spawns), not SwiftPM
        // package plugins; each therefore names its `path:` explicitly.
        .executableTarget(
            name: "pylon-echo", dependencies: ["PylonPluginKit"], path: "Plugins/echo",
            swiftSettings: strict),

        // Each shipped plugin is a library (its program is `XMain.run()`) plus a thin executable
        // in `main/`, so the multi-call `pylon` binary can link all of them (and tests link the
        // library, not an executable).
        .target(
            name: "pylon_uploader", dependencies: ["PylonPluginKit", "PylonStore", "PylonHTTP"],
            path: "Plugins/uploader", exclude: ["main"], swiftSettings: strict),
        .executableTarget(
            name: "pylon-uploader-main", dependencies: ["pylon_uploader"], path: "Plugins/uploader/main", swiftSettings: strict),

        .target(
            name: "pylon_ma", dependencies: ["PylonPluginKit", "PylonStore", "PylonHTTP"],
            path: "Plugins/ma", exclude: ["main"], swiftSettings: strict),
        .executableTarget(
            name: "pylon-ma-main", dependencies: ["pylon_ma"], path: "Plugins/ma/main", swiftSettings: strict),

        .target(
            name: "pylon_push", dependencies: ["PylonPluginKit", "PylonStore", "PylonHTTP", "PylonMQTT"],
            path: "Plugins/push", exclude: ["main"], swiftSettings: strict),
        .executableTarget(
            name: "pylon-push-main", dependencies: ["pylon_push"], path: "Plugins/push/main", swiftSettings: strict),

        .target(
            name: "pylon_gtm", dependencies: ["PylonPluginKit", "PylonStore", "PylonHTTP", "PylonTagEngine", "CPlist"],
            path: "Plugins/gtm", exclude: ["main"], swiftSettings: strict),
        .executableTarget(
            name: "pylon-gtm-main", dependencies: ["pylon_gtm"], path: "Plugins/gtm/main", swiftSettings: strict),

        // The device's programs in one executable (pylond and the four plugins, chosen by the
        // name it is started as): one copy of the code and the Swift runtime on flash and in memory.
        .executableTarget(
            name: "pylon", dependencies: ["PylonHost", "PylonPluginKit", "pylon_uploader", "pylon_ma", "pylon_push", "pylon_gtm"],
            swiftSettings: strict),

        // The reference backend: HTTP/1.1 on libuv with http-parser, SQLite storage, loopback.
        // Everything but `main` is a library so the fuzz target can run the same request path;
        // what `main` uses is `package`.
        .target(
            name: "PylonBackend",
            dependencies: [
                "PylonCore", "PylonProtocol", "PylonStore", "CHTTPParser", "CLibUV", "PylonMQTT", "CPQ", "CNATS", "CNATSLoop", "CCrypto",
            ],
            swiftSettings: strict),
        .executableTarget(name: "pylon-backend", dependencies: ["PylonBackend", "PylonCore"], swiftSettings: strict),

        // The fleet simulator (`make fleet`, docs/FLEET.md): K devices on one libuv loop through
        // the plugins' own HTTP and MQTT clients.
        .executableTarget(
            name: "pylon-fleet", dependencies: ["PylonCore", "PylonHTTP", "PylonMQTT", "PylonStore"], swiftSettings: strict),

        // Release-mode benchmark, run by hand (`make bench`).
        .executableTarget(
            name: "pylon-bench", dependencies: ["PylonClientKit", "PylonHTTP", "PylonMQTT", "PylonTagEngine"],
            path: "Benchmarks/pylon-bench",
            swiftSettings: strict),

        // libFuzzer targets (`make fuzz`, docs/HARDENING.md). Built with `-sanitize=fuzzer` and
        // `-DFUZZING` they are fuzzers; in an ordinary build each replays the inputs named on its
        // command line (a corpus under Fuzz/corpus, a crash artifact) through the same entry point.
        .target(name: "FuzzSupport", dependencies: ["PylonCore"], path: "Fuzz/Support", swiftSettings: strict),
        .executableTarget(name: "fuzz-message", dependencies: ["PylonCore", "FuzzSupport"], path: "Fuzz/message", swiftSettings: strict),
        .executableTarget(
            name: "fuzz-manifest", dependencies: ["PylonHost", "PylonProtocol", "FuzzSupport"], path: "Fuzz/manifest", swiftSettings: strict
        ),
        .executableTarget(
            name: "fuzz-backend-http", dependencies: ["PylonBackend", "PylonCore", "FuzzSupport"], path: "Fuzz/backend-http",
            swiftSettings: strict),
        // These two link the plugin libraries; what they call is `package` there (a fuzz build is
        // a release build, where `@testable import` is unavailable).
        .executableTarget(
            name: "fuzz-ma", dependencies: ["pylon_ma", "PylonPluginKit", "FuzzSupport"], path: "Fuzz/ma", swiftSettings: strict),
        .executableTarget(
            name: "fuzz-uploader", dependencies: ["pylon_uploader", "PylonPluginKit", "FuzzSupport"], path: "Fuzz/uploader",
            swiftSettings: strict),
        .executableTarget(
            name: "fuzz-segment", dependencies: ["pylon_uploader", "PylonCore", "CZlib", "FuzzSupport"], path: "Fuzz/segment",
            swiftSettings: strict),

        .testTarget(name: "PylonCoreTests", dependencies: ["PylonCore", "PylonProtocol", "PylonPluginKit"], swiftSettings: strict),
        .testTarget(name: "PylonProtocolTests", dependencies: ["PylonProtocol"], swiftSettings: strict),
        .testTarget(name: "PylonHostTests", dependencies: ["PylonHost", "PylonProtocol"], swiftSettings: strict),
        .target(name: "TestSupport", dependencies: ["PylonCore"], path: "Tests/TestSupport", swiftSettings: strict),
        .target(name: "PylonTesting", dependencies: ["PylonClientKit", "PylonProtocol"], swiftSettings: strict),
        .testTarget(
            name: "IntegrationTests", dependencies: ["PylonClientKit", "PylonProtocol", "PylonTesting", "TestSupport"],
            swiftSettings: strict),
        .testTarget(name: "UploaderTests", dependencies: ["pylon_uploader", "TestSupport"], swiftSettings: strict),
        .testTarget(name: "MATests", dependencies: ["pylon_ma", "TestSupport"], swiftSettings: strict),
        .testTarget(name: "PushTests", dependencies: ["pylon_push", "PylonMQTT"], swiftSettings: strict),
        .testTarget(name: "TagEngineTests", dependencies: ["PylonTagEngine"], swiftSettings: strict),
        .testTarget(name: "FleetTests", dependencies: ["pylon-fleet"], swiftSettings: strict),
        // The append-only logs of the push inbox and the gtm.lifetime values (issue 24 item 3).
        .testTarget(name: "StoreLogTests", dependencies: ["pylon_push", "pylon_gtm", "PylonStore"], swiftSettings: strict),
        .testTarget(
            name: "BackendTests", dependencies: ["PylonBackend", "PylonClientKit", "PylonStore", "TestSupport"], swiftSettings: strict),
    ]
)
