import Foundation
import PylonClientKit
import TestSupport
import Testing

/// The console's data API on a real backend: event search, live tail, users, erasure, push
/// history, analytics, privacy and retention (docs/backend-openapi.yaml), on SQLite and
/// PostgreSQL.
@Suite(.serialized) struct ConsoleDataTests {
    /// An MA event record as the MA plugin writes it.
    static func event(_ id: String, _ name: String, euid: String?, time: Int64, props: JSON = ["n": 1]) -> JSON {
        [
            "id": .string(id), "ts": .int(time),
            "data": ["event": .string(name), "time": .int(time), "euid": euid.map(JSON.string) ?? .null, "properties": props],
        ]
    }

    static func post(_ b: BackendProcess, app: String, key: String, _ records: [JSON]) throws {
        let body: JSON = ["batch": .string(key), "stream": .string("ma.\(app)"), "records": .array(records)]
        let r = try b.postBatch("ma.\(app)", key: key, body)
        guard r.status == 200 else { throw TestFailure(description: "batch \(key): \(r.status) \(r.text)") }
    }

    /// Every page of a search, following `nextCursor`.
    static func walk(_ b: BackendProcess, _ query: String) throws -> [JSON] {
        var out: [JSON] = []
        var cursor: String?
        for _ in 0..<1000 {
            let target = "/v1/admin/events?" + query + (cursor.map { "&cursor=" + $0 } ?? "")
            let page = try b.get(target)
            out += page["items"]?.arrayValue ?? []
            guard let next = page["nextCursor"]?.stringValue else { return out }
            cursor = next
        }
        throw TestFailure(description: "the cursor never ended")
    }

    @Test(arguments: StoreKind.allCases) func searchFiltersAndTheCursorWalksEachEventOnce(_ kind: StoreKind) throws {
        let b = try BackendProcess(store: kind)
        let user = try b.ma("start", ["deviceId": "d1", "identity": ["user_id": "u-1"]], app: "shop")
        let e1 = try #require(user["euid"]?.stringValue)
        let t0: Int64 = 1_760_000_000_000
        var records: [JSON] = []
        for i in 0..<30 {
            records.append(
                ConsoleDataTests.event(
                    "r\(i)", ["open", "buy", "<img src=x onerror=alert(1)>"][i % 3], euid: i % 2 == 0 ? e1 : "other-euid",
                    time: t0 + Int64(i) * 1000))
        }
        try ConsoleDataTests.post(b, app: "shop", key: "k1", Array(records[0..<20]))
        try ConsoleDataTests.post(b, app: "shop", key: "k2", Array(records[20...]))
        // The same records again (another key): stored once, indexed once.
        try ConsoleDataTests.post(b, app: "shop", key: "k3", Array(records[0..<5]))
        try ConsoleDataTests.post(b, app: "other", key: "k4", [ConsoleDataTests.event("x", "open", euid: nil, time: t0)])

        let all = try ConsoleDataTests.walk(b, "appKey=shop&limit=7")
        #expect(all.count == 30)
        #expect(Set(all.compactMap { $0["id"]?.intValue }).count == 30)
        let times = all.compactMap { $0["timeMs"]?.intValue }
        #expect(times == times.sorted(by: >))
        #expect(times.first == t0 + 29_000)

        let buys = try ConsoleDataTests.walk(b, "appKey=shop&event=buy&limit=4")
        #expect(buys.count == 10)
        #expect(buys.allSatisfy { $0["event"] == "buy" && $0["appKey"] == "shop" && $0["stream"] == "ma.shop" })
        let hostile = try ConsoleDataTests.walk(b, "appKey=shop&event=%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E")
        #expect(hostile.count == 10)

        let mine = try ConsoleDataTests.walk(b, "appKey=shop&user=u-1&limit=6")
        #expect(mine.count == 15)
        #expect(mine.allSatisfy { $0["euid"] == .string(e1) && $0["userId"] == "u-1" })
        #expect(try ConsoleDataTests.walk(b, "appKey=shop&euid=other-euid").count == 15)
        #expect(try ConsoleDataTests.walk(b, "appKey=shop&user=nobody").isEmpty)

        let window = try ConsoleDataTests.walk(b, "appKey=shop&fromMs=\(t0 + 10_000)&toMs=\(t0 + 20_000)&limit=3")
        #expect(window.compactMap { $0["timeMs"]?.intValue } == (10..<20).reversed().map { t0 + Int64($0) * 1000 })
        #expect(try ConsoleDataTests.walk(b, "stream=ma.other").count == 1)
        let first = try #require(all.first)
        #expect(first["properties"] == ["n": 1])

        #expect(try b.request("GET", "/v1/admin/events?event=buy").status == 400)
        #expect(try b.request("GET", "/v1/admin/events?appKey=shop&cursor=nonsense").status == 400)
        #expect(try b.request("GET", "/v1/admin/events?appKey=shop&limit=501").status == 400)
        #expect(try b.request("GET", "/v1/admin/events", headers: [("Authorization", "")]).status == 401)
    }

    @Test(arguments: StoreKind.allCases) func theLiveTailReceivesAnIngestedEvent(_ kind: StoreKind) throws {
        let b = try BackendProcess(store: kind)
        let tail = try SSEReader(port: b.port, "/v1/admin/events/tail?appKey=shop&event=buy")
        #expect(tail.status == 200)
        #expect(tail.headers["content-type"] == "text/event-stream")
        try ConsoleDataTests.post(
            b, app: "shop", key: "k1",
            [
                ConsoleDataTests.event("a", "open", euid: "e", time: 1), ConsoleDataTests.event("b", "buy", euid: "e", time: 2),
            ])
        try ConsoleDataTests.post(b, app: "other", key: "k2", [ConsoleDataTests.event("c", "buy", euid: "e", time: 3)])
        let frame = try tail.next(timeout: 10)
        #expect(frame["event"] == "buy")
        #expect(frame["appKey"] == "shop")
        #expect(frame["timeMs"] == 2)
        // Only the matching event: the next frame is a later matching one.
        try ConsoleDataTests.post(b, app: "shop", key: "k3", [ConsoleDataTests.event("d", "buy", euid: "e", time: 4)])
        #expect(try tail.next(timeout: 10)["timeMs"] == 4)
    }

    @Test func liveTailsAreBounded() throws {
        let b = try BackendProcess(["--max-sse-clients", "1"])
        let first = try SSEReader(port: b.port, "/v1/admin/events/tail")
        #expect(first.status == 200)
        let second = try b.request("GET", "/v1/admin/events/tail")
        #expect(second.status == 503)
    }
}

/// Reads a Server-Sent Events response from a raw socket.
final class SSEReader {
    let fd: Int32
    private(set) var status = 0
    private(set) var headers: [String: String] = [:]
    private var buffer: [UInt8] = []

    init(port: UInt16, _ target: String) throws {
        let c = try RawHTTPClient(port: port)
        fd = dup(c.fd)
        try c.send(RawHTTPClient.message("GET", target))
        let head = try read(until: [13, 10, 13, 10], timeout: 10)
        let lines = String(decoding: head, as: UTF8.self).components(separatedBy: "\r\n")
        status = Int(lines.first?.split(separator: " ").dropFirst().first ?? "") ?? 0
        for l in lines.dropFirst() {
            guard let colon = l.firstIndex(of: ":") else { continue }
            headers[l[..<colon].lowercased()] = l[l.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
    }

    deinit { close(fd) }

    /// The bytes up to and including `delimiter`, waiting at most `timeout` seconds.
    private func read(until delimiter: [UInt8], timeout: Double) throws -> [UInt8] {
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            if buffer.count >= delimiter.count {
                for i in 0...(buffer.count - delimiter.count) where buffer[i..<(i + delimiter.count)].elementsEqual(delimiter) {
                    let out = Array(buffer[..<(i + delimiter.count)])
                    buffer.removeFirst(i + delimiter.count)
                    return out
                }
            }
            let left = Int32(max(0, deadline.timeIntervalSinceNow * 1000))
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard left > 0, poll(&pfd, 1, left) == 1 else { throw TestFailure(description: "nothing within \(timeout) s") }
            var b = [UInt8](repeating: 0, count: 65536)
            let n = recv(fd, &b, b.count, 0)
            guard n > 0 else { throw TestFailure(description: "the stream closed") }
            buffer.append(contentsOf: b[..<n])
        }
    }

    /// The data of the next `event: record` frame (comments and other frames skipped).
    func next(timeout: Double) throws -> JSON {
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            let frame = String(decoding: try read(until: [10, 10], timeout: max(0.01, deadline.timeIntervalSinceNow)), as: UTF8.self)
            let lines = frame.split(separator: "\n")
            guard lines.contains("event: record"), let data = lines.first(where: { $0.hasPrefix("data: ") }) else { continue }
            return try JSON.parse(String(data.dropFirst(6)))
        }
    }
}
