import Foundation
import PylonClientKit
import TestSupport
import Testing

/// A batch member costs what the same request costs alone (issue 32, item 2): the batch's reply
/// stays within the line limit, the host's memory for one uid within that uid's output bound,
/// and another uid is served while one uid floods the host with batches it never reads.
@Suite(.serialized) struct BatchBoundTests {
    static let describeOpenRPC = #"{"jsonrpc":"2.0","id":ID,"method":"bus.describe","params":{"format":"openrpc"}}"#

    static func batch(_ n: Int, _ member: String = describeOpenRPC) -> String {
        "[" + (0..<n).map { member.replacingOccurrences(of: "ID", with: "\($0)") }.joined(separator: ",") + "]"
    }

    /// The reply to a batch of large answers is one line within `maxLineBytes`: the members
    /// whose answers fit have them, each other one a -32006 entry naming the limit; every
    /// request is answered once.
    @Test func aBatchsReplyStaysWithinTheLineLimit() throws {
        let limit = 65_536
        let h = try TestHost(extra: ["limits": ["maxLineBytes": .int(Int64(limit))]])
        let c = try h.client()
        let one = try c.call("bus.describe", ["format": "openrpc"]).serialized.utf8.count
        let n = 32
        #expect(one * n > limit, "the test needs answers that cannot all fit (one is \(one) bytes)")
        try c.sendLine(Self.batch(n))
        let line = try #require(try c.readLine(timeoutMs: 10_000))
        #expect(line.utf8.count <= limit, "a batch reply of \(line.utf8.count) bytes, over maxLineBytes")
        let items = try #require(try JSON.parse(line).arrayValue)
        let ids = items.compactMap { $0["id"]?.intValue }
        #expect(Set(ids) == Set((0..<n).map(Int64.init)) && ids.count == n, "each request answered once")
        let results = items.filter { $0["result"]?["openrpc"] == "1.2.6" }
        let tooLarge = items.filter { $0.errorCode == -32006 }
        #expect(!results.isEmpty && results.count + tooLarge.count == n)
        #expect(tooLarge.allSatisfy { $0["error"]?["data"]?["limit"] == "maxLineBytes" }, "\(tooLarge.first?.serialized ?? "")")
        // A member alone is answered in full.
        #expect(try c.call("bus.describe", ["format": "openrpc"]).serialized.utf8.count == one)
    }

    /// A batch whose members cost more than one loop turn's budget (40 reports at 32 units each)
    /// is handled over several turns, from where it stopped: every member answered once, with
    /// its own answer, forwarded ones included; the connection goes on after it.
    @Test func aBatchHandledOverManyTurnsAnswersEveryMemberOnce() throws {
        let h = try TestHost()
        let c = try h.client()
        let n = 120
        let members = (0..<n).map { i -> String in
            switch i % 3 {
            case 0: return #"{"jsonrpc":"2.0","id":\#(i),"method":"bus.describe"}"#
            case 1: return #"{"jsonrpc":"2.0","id":\#(i),"method":"echo.echo","params":{"i":\#(i)}}"#
            default: return #"{"jsonrpc":"2.0","id":\#(i),"method":"bus.ping"}"#
            }
        }
        try c.sendLine("[" + members.joined(separator: ",") + "]\n" + #"{"jsonrpc":"2.0","id":"after","method":"bus.ping"}"#)
        var batch: [JSON]?
        var after: JSON?
        for _ in 0..<2 {
            let m = try JSON.parse(try #require(try c.readLine(timeoutMs: 20_000)))
            if let a = m.arrayValue { batch = a } else { after = m }
        }
        let items = try #require(batch)
        #expect(after?["result"]?["pong"] == .bool(true))
        #expect(items.count == n)
        var byId: [Int64: JSON] = [:]
        for m in items { byId[m["id"]?.intValue ?? -1] = m }
        #expect(byId.count == n, "each member answered once")
        for i in 0..<n {
            let m = byId[Int64(i)]
            switch i % 3 {
            case 0: #expect(m?["result"]?["plugins"]?["echo"] != nil, "\(i): \(m?.serialized.prefix(200) ?? "none")")
            case 1: #expect(m?["result"] == ["i": .int(Int64(i))], "\(i): \(m?.serialized ?? "none")")
            default: #expect(m?["result"]?["pong"] == .bool(true), "\(i)")
            }
        }
    }

    /// The attack of the issue: 64 connections of uid 65534 each write two batches of 128
    /// `bus.describe {"format":"openrpc"}` and never read. The host holds for that uid no more
    /// than its output bound (its connections that hold the most are disconnected:
    /// `slow_readers_closed`), its RSS stays under 100 MB, and another uid's pings are all
    /// answered meanwhile.
    @Test func oneUidsBatchFloodNeitherStallsNorBloatsTheHost() throws {
        let perUid = 16 << 20  // maxQueuedBytesPerUid's default
        let h = try TestHost.open()
        let victim = try h.client()
        let rssBefore = rssKiB(h.pid)
        let flood = try BatchFlood(h, conns: 64, lines: 2, members: 128)
        defer { flood.stop() }
        var peak = rssBefore
        var worstUidQueued = 0
        var answered = 0
        for i in 0..<200 {
            let r = try victim.call("bus.ping", nil, timeoutMs: 20_000)
            if r["pong"] == .bool(true) { answered += 1 }
            peak = max(peak, rssKiB(h.pid))
            if i % 20 == 0 {
                let clients = try victim.call("bus.status", nil, timeoutMs: 20_000)["clients"]?.arrayValue ?? []
                let queued = clients.filter { $0["uid"] == 65534 }.reduce(0) { $0 + Int($1["queued_bytes"]?.intValue ?? 0) }
                worstUidQueued = max(worstUidQueued, queued)
            }
        }
        #expect(answered == 200, "the victim's pings: \(answered) of 200 answered")
        // The bound acted; the host's memory is sampled until then too.
        try waitUntil(timeout: 60) {
            peak = max(peak, rssKiB(h.pid))
            return (try victim.call("bus.status", nil, timeoutMs: 20_000)["counters"]?["slow_readers_closed"]?.intValue ?? 0) > 0
        }
        peak = max(peak, rssKiB(h.pid))
        let counters = try h.status()["counters"]
        #expect((counters?["slow_readers_closed"]?.intValue ?? 0) > 0, "the uid's output bound acted")
        #expect(worstUidQueued <= perUid + (1 << 20) + 65_536, "uid 65534 held \(worstUidQueued) bytes")
        #expect(peak < 100 * 1024, "host RSS \(rssBefore) KiB before, \(peak) KiB at the peak")
        #expect(try victim.call("bus.ping")["pong"] == .bool(true))
    }

    /// The shared answers follow what they show: a method provided (or withdrawn) appears in
    /// (or leaves) the next `bus.describe`, and a change made by a host method shows in a
    /// `bus.status` read in the same write.
    @Test func sharedReportsFollowChanges() throws {
        let h = try TestHost()
        let a = try h.client()
        let b = try h.client()
        func names() throws -> Set<String> {
            Set((try a.call("bus.describe", ["format": "openrpc"])["methods"]?.arrayValue ?? []).compactMap { $0["name"]?.stringValue })
        }
        #expect(!(try names()).contains("late.method"))
        _ = try b.call("bus.provide", ["method": "late.method"])
        #expect(try names().contains("late.method"))
        #expect((try a.call("bus.describe")["provided"]?["late.method"]) != nil)
        _ = try b.call("bus.unprovide", ["method": "late.method"])
        #expect(!(try names()).contains("late.method"))
        // A subscription and a status in one write: the status shows it.
        try a.sendLine(
            #"{"jsonrpc":"2.0","id":1,"method":"bus.status"}"# + "\n"
                + #"{"jsonrpc":"2.0","id":2,"method":"bus.subscribe","params":{"pattern":"x.*"}}"#
                + "\n" + #"{"jsonrpc":"2.0","id":3,"method":"bus.status"}"#)
        var byId: [Int64: JSON] = [:]
        for _ in 0..<3 {
            let m = try #require(try a.readMessage(timeoutMs: 5000))
            byId[m["id"]?.intValue ?? -1] = m
        }
        let mine = { (s: JSON?) in s?["result"]?["clients"]?.arrayValue?.contains { $0["subscriptions"] == ["x.*"] } ?? false }
        #expect(!mine(byId[1]) && mine(byId[3]), "\(byId[3]?.serialized.prefix(400) ?? "")")
    }
}

/// `Tests/fixtures/batch_flood.py` as uid 65534: connections that send batches and never read,
/// held open until `stop`.
final class BatchFlood {
    let process: Process
    private let input = Pipe()
    private let output = Pipe()

    init(_ host: TestHost, uid: UInt32 = 65534, conns: Int, lines: Int, members: Int) throws {
        let script = try String(contentsOfFile: fixturesDir + "/batch_flood.py", encoding: .utf8)
        process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        process.arguments = [
            "--reuid=\(uid)", "--regid=\(uid)", "--clear-groups", "/usr/bin/python3", "-c", script, host.socket, "\(conns)", "\(lines)",
            "\(members)",
        ]
        process.standardInput = input
        process.standardOutput = output
        try process.run()
        // "sent N M" once every line is written.
        var seen = Data()
        while !String(decoding: seen, as: UTF8.self).contains("\n") {
            let d = output.fileHandleForReading.availableData
            if d.isEmpty { throw TestFailure(description: "batch_flood.py exited") }
            seen.append(d)
        }
        let words = String(decoding: seen, as: UTF8.self).split(separator: " ")
        guard words.first == "sent", words.count == 3, Int(words[1].trimmingCharacters(in: .whitespacesAndNewlines)) == conns else {
            throw TestFailure(description: "batch_flood.py: \(String(decoding: seen, as: UTF8.self))")
        }
    }

    func stop() {
        try? input.fileHandleForWriting.close()
        process.waitUntilExit()
    }
}

/// Resident set size of a process in KiB (0 if it cannot be read).
func rssKiB(_ pid: Int32) -> Int {
    guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return 0 }
    for line in text.split(separator: "\n") where line.hasPrefix("VmRSS:") {
        return Int(line.dropFirst(6).filter { $0 >= "0" && $0 <= "9" }) ?? 0
    }
    return 0
}
