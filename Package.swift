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

        // Loop wrappers, framing, JSON, protocol types, logging. No Foundation.
        .target(name: "PylonCore", dependencies: ["CLibUV", "CJSONC"], swiftSettings: strict),
        // The host's concerns: config, router, supervisor, consent.
        .target(name: "PylonHost", dependencies: ["PylonCore"], swiftSettings: strict),
        // What plugins and apps link.
        .target(name: "PylonPluginKit", dependencies: ["PylonCore"], swiftSettings: strict),
        .target(name: "PylonClientKit", dependencies: ["PylonCore"], swiftSettings: strict),

        // Thin executables.
        .executableTarget(name: "pylond", dependencies: ["PylonHost"], swiftSettings: strict),
        .executableTarget(name: "pylonctl", dependencies: ["PylonClientKit"], swiftSettings: strict),

        // `Plugins/` holds Pylon's plugin *executables* (services the host spawns), not SwiftPM
        // package plugins; each therefore names its `path:` explicitly.
        .executableTarget(
            name: "pylon-echo", dependencies: ["PylonPluginKit"], path: "Plugins/echo",
            swiftSettings: strict),

        // Release-mode benchmark, run by hand (`make bench`).
        .executableTarget(
            name: "pylon-bench", dependencies: ["PylonClientKit"], path: "Benchmarks/pylon-bench",
            swiftSettings: strict),

        .testTarget(name: "PylonCoreTests", dependencies: ["PylonCore"]),
        .testTarget(name: "PylonHostTests", dependencies: ["PylonHost"]),
        .testTarget(name: "IntegrationTests", dependencies: ["PylonClientKit"]),
    ]
)
