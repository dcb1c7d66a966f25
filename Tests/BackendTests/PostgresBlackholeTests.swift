import Foundation
import PylonClientKit
import PylonCore
import TestSupport
import Testing

/// PostgreSQL behind a filter that drops its packets (not a refused connection): the statement
/// in flight fails within the TCP bounds the engine sets (`StoreLimits.tcpUserTimeoutMs`,
/// keepalives), and then the backend reconnects in the background (`PQconnectStartParams` +
/// `PQconnectPoll` on the loop): requests meanwhile are answered 503 at once instead of each
/// holding the loop for a connect timeout, and the backend recovers when the packets flow again.
///
/// Needs root and `nft` (nftables, installed by `make deps`): the filter is an nftables table
/// of its own on the output hook, for the test server's TCP port only, removed at the end.
@Suite(.serialized) struct PostgresBlackholeTests {
    static let nft = "/usr/sbin/nft"
    static var usable: Bool { getuid() == 0 && FileManager.default.isExecutableFile(atPath: nft) }
    /// Database requests made while the packets are dropped.
    static let requestsWhileDropped = 20

    /// An nftables table dropping every TCP packet to or from `port`.
    final class PacketDrop {
        let table = "pylon_test_" + System.randomHex(4)
        init(port: Int) throws {
            try PacketDrop.nft(["add", "table", "inet", table])
            try PacketDrop.nft(["add", "chain", "inet", table, "out", "{ type filter hook output priority 0 ; }"])
            try PacketDrop.nft(["add", "rule", "inet", table, "out", "tcp", "dport", String(port), "drop"])
            try PacketDrop.nft(["add", "rule", "inet", table, "out", "tcp", "sport", String(port), "drop"])
        }
        private var removed = false
        func remove() {
            guard !removed else { return }
            removed = true
            try? PacketDrop.nft(["delete", "table", "inet", table])
        }
        deinit { remove() }

        static func nft(_ args: [String]) throws {
            let p = Process()
            p.executableURL = URL(fileURLWithPath: PostgresBlackholeTests.nft)
            p.arguments = args
            try p.run()
            p.waitUntilExit()
            guard p.terminationStatus == 0 else { throw TestFailure(description: "nft \(args) failed: \(p.terminationStatus)") }
        }
    }

    @Test(.enabled(if: PostgresBlackholeTests.usable, "needs root and nft"))
    func droppedPacketsCostOneBoundedStatementThenReconnectInTheBackground() throws {
        let server = try PostgresServer(tcpPort: try chooseFreeLoopbackPort())
        let db = try server.createDatabase()
        let b = try BackendProcess(database: ["--db", db])
        #expect(try b.postBatch("s", key: "before", batchBody(key: "before", stream: "s", ids: ["r0"])).status == 200)

        let drop = try PacketDrop(port: server.port)
        defer { drop.remove() }
        // The statement in flight when the packets stop: failed by TCP's bounds, answered 503.
        let started = Date()
        let first = try b.postBatch("s", key: "during", batchBody(key: "during", stream: "s", ids: ["r1"]))
        #expect(first.status == 503, "\(first.text)")
        print("PostgresBlackholeTests: the statement in flight failed after \(Int(Date().timeIntervalSince(started) * 1000)) ms")
        // Every request now: 503 at once while one background connection attempt waits on the
        // dropped SYN; the loop keeps answering the routes that need no database.
        var slowestHealthMs = 0.0
        for i in 0..<PostgresBlackholeTests.requestsWhileDropped {
            let r = try b.request("GET", "/v1/inspect/streams/s")
            #expect(r.status == 503, "request \(i): \(r.text)")
            let t0 = Date()
            #expect(try b.request("GET", "/healthz").status == 200)
            slowestHealthMs = max(slowestHealthMs, Date().timeIntervalSince(t0) * 1000)
        }
        let stats = try b.get("/v1/inspect/stats")
        let attempts = stats["database"]?["reconnectAttempts"]?.intValue ?? .max
        #expect(
            attempts <= 2,
            "\(PostgresBlackholeTests.requestsWhileDropped) requests started \(attempts) connection attempts: they did not wait on one")
        #expect(stats["database"]?["connected"] == false)
        print("PostgresBlackholeTests: slowest /healthz while the database's packets were dropped: \(Int(slowestHealthMs)) ms")

        // Packets flow again: the next attempt connects, and the batch is stored.
        drop.remove()
        try waitUntil(timeout: 30) {
            try b.postBatch("s", key: "after", batchBody(key: "after", stream: "s", ids: ["r2"])).status == 200
        }
        #expect(try b.get("/v1/inspect/stats")["database"]?["connected"] == true)
        #expect(b.stop() == 0)
    }
}
