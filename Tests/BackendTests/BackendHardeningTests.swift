import Foundation
import PylonClientKit
import TestSupport
import Testing

/// Regressions for what a hostile probe found (slow clients, pipelining without reading, odd
/// HTTP versions, file modes, path decoding). Deadlines are shortened with flags so the tests
/// run fast; timing assertions are only generous upper bounds.
@Suite(.serialized) struct BackendHardeningTests {
    // MARK: Deadlines

    @Test func trickledHeadersGet408AtTheHeaderDeadline() throws {
        // The idle timeout is long: only the header deadline can end this connection.
        let b = try BackendProcess(["--header-timeout-ms", "500", "--idle-timeout-ms", "60000"])
        let c = try b.client()
        try c.send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        // One byte every 100 ms: each used to reset the idle timer.
        try c.trickle(
            Array("X-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa".utf8), everyMs: 100,
            untilReadableWithinMs: 10_000)
        let r = try #require(try c.readResponse())
        #expect(r.status == 408)
        #expect(r.headers["connection"] == "close")
        #expect(try r.json()["code"] == "request_timeout")
        #expect(try c.isClosedByPeer())  // by the header deadline: the idle timeout is 60 s, the trickle 10 s at most
        // Others are served meanwhile and afterwards.
        #expect(try b.request("GET", "/healthz").status == 200)
    }

    @Test func aSlowBodyGets408AtTheBodyDeadline() throws {
        let b = try BackendProcess(["--body-timeout-ms", "500", "--idle-timeout-ms", "60000"])
        let c = try b.client()
        try c.send("POST /v1/batches/s HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: k\r\nContent-Length: 1000\r\n\r\n{")
        try c.trickle(Array(repeating: UInt8(ascii: " "), count: 100), everyMs: 100, untilReadableWithinMs: 10_000)
        let r = try #require(try c.readResponse())
        #expect(r.status == 408)
        #expect(try r.json()["code"] == "request_timeout")
        #expect(try c.isClosedByPeer())  // by the body deadline (idle timeout 60 s)
        #expect(try b.get("/v1/inspect/streams/s")["records"] == 0)
    }

    @Test func idleConnectionsCloseWithoutAResponse() throws {
        let b = try BackendProcess(["--idle-timeout-ms", "300", "--header-timeout-ms", "60000"])
        // Never sent anything.
        let silent = try b.client()
        // Between requests, after a keep-alive response.
        let kept = try b.client()
        #expect(try kept.request("GET", "/healthz").status == 200)
        #expect(try silent.isClosedByPeer(timeoutMs: 5_000))
        #expect(try kept.isClosedByPeer(timeoutMs: 5_000))
        // End of stream came first: no response before it (nothing can follow it).
        #expect(try silent.readResponse() == nil)
    }

    @Test func partialConnectionsCannotExhaustTheConnectionLimit() throws {
        let b = try BackendProcess(["--max-connections", "9"])
        var partial: [RawHTTPClient] = []
        for _ in 0..<8 {
            let c = try b.client()
            try c.send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a")
            partial.append(c)
        }
        // The ninth connection is a barrier: it is accepted after the eight (in connect order,
        // so the first is the oldest), and by the time its answer arrives the backend has read
        // their partial requests (already sent, so polled no later than this one's). It stays
        // open and, having finished a request, is more recently active than any of them.
        let probe = try b.client()
        #expect(try probe.request("GET", "/healthz").status == 200)
        // Used to be 503 `too_many_connections` until the partial ones timed out.
        #expect(try b.request("GET", "/healthz").status == 200)
        // The oldest waiting connection made room; it was told why.
        let evicted = try #require(try partial[0].readResponse())
        #expect(evicted.status == 503)
        #expect(try partial[0].isClosedByPeer())
        // The others are still open: each finishes its request and is answered.
        for c in partial.dropFirst() {
            try c.send("\r\n\r\n")
            #expect(try c.readResponse()?.status == 200)
        }
    }

    @Test func connectionLimitAnswers503WhenNoConnectionCanBeClosed() throws {
        let b = try BackendProcess(["--max-connections", "4"])
        try b.setFaults(["latencyMs": 3_000])
        // Each holds a response back (injected latency): work in progress is never evicted.
        var busy: [RawHTTPClient] = []
        for _ in 0..<4 {
            let c = try b.client()
            try c.send(RawHTTPClient.message("GET", "/held"))
            busy.append(c)
        }
        // Until all four are held (another request would take a slot of its own).
        try waitUntil(timeout: 5) { b.logText.components(separatedBy: "target=/held").count > 4 }
        let extra = try b.client()
        let r = try #require(try extra.readResponse())
        #expect(r.status == 503)
        #expect(try r.json()["code"] == "too_many_connections")
        for c in busy { #expect(try c.readResponse()?.status == 404) }
    }

    // MARK: Pipelining without reading

    @Test func pipeliningWithoutReadingKeepsMemoryBounded() throws {
        let b = try BackendProcess()
        // Make each stats response large (~20 KB): 1000 distinct paths in requestsByPath.
        let warm = try b.client()
        var blob: [UInt8] = []
        for i in 0..<1000 { blob += RawHTTPClient.message("GET", "/distinct/path/number/\(i)") }
        try warm.send(blob)
        for _ in 0..<1000 { #expect(try warm.readResponse()?.status == 404) }
        let baseline = try vmRSSKiB(b.process.processIdentifier)

        let one = RawHTTPClient.message("GET", "/v1/inspect/stats")
        let burst = [UInt8]((0..<(256 * 1024 / one.count)).flatMap { _ in one })
        var greedy: [RawHTTPClient] = []
        for _ in 0..<8 {
            let c = try b.client()
            c.setNonBlocking()
            greedy.append(c)
        }
        // Send whatever the kernel takes, for a while; never read.
        // Per client, where in the endless stream of requests the next send starts.
        var offsets = [Int](repeating: 0, count: greedy.count)
        let until = Date().addingTimeInterval(2)
        while Date() < until {
            for (i, c) in greedy.enumerated() {
                offsets[i] = (offsets[i] + c.sendSome(Array(burst[offsets[i]...]))) % burst.count
            }
            // Until the backend has read some: one of the sockets takes more (50 ms at most).
            var fds = greedy.map { pollfd(fd: $0.fd, events: Int16(POLLOUT), revents: 0) }
            _ = poll(&fds, nfds_t(fds.count), 50)
        }
        // Everyone else is still served (the long timeout lets an unbounded backend finish
        // its backlog, so the memory it took is measured rather than a timeout).
        let other = try b.client()
        try other.send(RawHTTPClient.message("GET", "/healthz"))
        #expect(try other.readResponse(timeoutMs: 120_000)?.status == 200)
        let rss = try vmRSSKiB(b.process.processIdentifier)
        // Unbounded, this was hundreds of MB; bounded it is about a MiB per connection.
        #expect(rss - baseline < 64 * 1024, "VmRSS grew from \(baseline) KiB to \(rss) KiB")
        // And a greedy client that starts reading gets its answers, in order.
        greedy[0].setNonBlocking(false)
        for _ in 0..<10 { #expect(try greedy[0].readResponse()?.status == 200) }
    }

    // MARK: Output budget (issue 21 item 7)

    /// Record pages a client does not read stay queued in the backend; beyond
    /// `--max-output-bytes` in total, large responses are answered 503 until they are read.
    @Test(arguments: StoreKind.allCases) func unreadRecordPagesAreBoundedInTotal(_ store: StoreKind) throws {
        let b = try BackendProcess(["--max-output-bytes", "1048576"], store: store)
        let pad = String(repeating: "x", count: 900_000)
        for i in 0..<9 {
            let body: JSON = ["records": [["id": .string("r\(i)"), "ts": 1, "data": ["pad": .string(pad)]]]]
            #expect(try b.postBatch("big", key: "k\(i)", body).status == 200)
        }
        let page = RawHTTPClient.message("GET", "/v1/inspect/streams/big/records?limit=1000")
        let slow = try RawHTTPClient(port: b.port, receiveBuffer: 4096)
        try slow.send(page)  // ~8 MB answer, never read for now
        var busy: HTTPReply?
        try waitUntil(timeout: 10) {
            let r = try b.client().request("GET", "/v1/inspect/streams/big/records?limit=1000")
            busy = r
            return r.status == 503
        }
        #expect(try busy?.json()["code"] == "server_busy")
        #expect(busy?.headers["retry-after"] == "1")
        // Small answers are still served.
        #expect(try b.request("GET", "/healthz").status == 200)
        #expect(try b.request("GET", "/v1/inspect/streams/big").status == 200)
        // Once the slow client reads its page, large answers go out again.
        let mine = try #require(try slow.readResponse(timeoutMs: 30_000))
        #expect(mine.status == 200)
        #expect(try mine.json()["records"]?.arrayValue?.count == 9)
        try waitUntil(timeout: 10) { try b.request("GET", "/v1/inspect/streams/big/records?limit=1000").status == 200 }
    }

    // MARK: HTTP versions

    @Test func unsupportedHTTPVersionsAre505() throws {
        let b = try BackendProcess()
        for version in ["HTTP/9.9", "HTTP/2.0", "HTTP/0.9", "HTTP/1.2"] {
            let c = try b.client()
            try c.send("GET /healthz \(version)\r\nHost: 127.0.0.1\r\n\r\n")
            let r = try #require(try c.readResponse(), "\(version)")
            #expect(r.status == 505, "\(version)")
            #expect(try r.json()["code"] == "http_version_not_supported")
            #expect(try c.isClosedByPeer())
        }
        let old = try b.client()
        try old.send("GET /healthz HTTP/1.0\r\n\r\n")
        #expect(try old.readResponse()?.status == 200)
        #expect(try b.request("GET", "/healthz").status == 200)
    }

    // MARK: Files

    @Test func databaseFilesAreCreatedOwnerOnly() throws {
        let dir = NSTemporaryDirectory() + "pylon-backend-mode-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let db = dir + "/backend.db"
        // The usual umask: without a fix the files come out 0644.
        let saved = umask(0o022)
        defer { umask(saved) }
        do {
            let b = try BackendProcess(["--db", db])
            #expect(try b.postBatch("s", key: "k", batchBody(key: "k", stream: "s", ids: ["1"])).status == 200)
            for f in [db, db + "-wal", db + "-shm"] { #expect(try mode(f) == 0o600, "\(f)") }
            #expect(b.stop() == 0)
        }
        // A database left readable by an older version is tightened on open.
        #expect(chmod(db, 0o644) == 0)
        let b = try BackendProcess(["--db", db])
        #expect(try b.postBatch("s", key: "k2", batchBody(key: "k2", stream: "s", ids: ["2"])).status == 200)
        for f in [db, db + "-wal", db + "-shm"] { #expect(try mode(f) == 0o600, "\(f)") }
    }

    // MARK: Paths

    @Test func plusIsLiteralInPathSegments() throws {
        let b = try BackendProcess()
        #expect(try b.postBatch("a+b", key: "k", batchBody(key: "k", stream: "a+b", ids: ["1"])).status == 200)
        #expect(try b.get("/v1/inspect/streams/a+b")["records"] == 1)
        #expect(try b.get("/v1/inspect/streams/a%2Bb")["records"] == 1)
        #expect(try b.get("/v1/inspect/streams/a%20b")["records"] == 0)
        // In a query string `+` still means a space (form encoding).
        #expect(try b.request("GET", "/v1/inspect/streams/a+b/records?limit=+5").status == 400)
    }

    @Test func faultExemptionLooksAtTheDecodedPath() throws {
        let b = try BackendProcess()
        try b.setFaults(["failNext": 1])
        // `%69` is `i`: this is /v1/inspect/stats, which faults never touch.
        #expect(try b.request("GET", "/v1/%69nspect/stats").status == 200)
        #expect(try b.request("GET", "/v1/%66aults").status == 200)
        #expect(try b.get("/v1/faults")["failNext"] == 1)
        #expect(try b.request("GET", "/nothing").status == 503)
    }
}

/// `VmRSS` of process `pid`, in KiB, from /proc/PID/status.
private func vmRSSKiB(_ pid: Int32) throws -> Int {
    let status = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
    guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
        let kib = Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "")
    else { throw TestFailure(description: "no VmRSS in /proc/\(pid)/status") }
    return kib
}

/// The permission bits of `path`.
private func mode(_ path: String) throws -> mode_t {
    var st = stat()
    guard stat(path, &st) == 0 else { throw TestFailure(description: "stat \(path): errno \(errno)") }
    return st.st_mode & 0o777
}

extension RawHTTPClient {
    /// Sends `bytes` one at a time, `everyMs` apart, until the server has something to say
    /// (or closes); throws if it stays silent for `untilReadableWithinMs`. Send errors after
    /// the server gave up are ignored.
    func trickle(_ bytes: [UInt8], everyMs: Int32, untilReadableWithinMs limit: Int32) throws {
        let deadline = Date().addingTimeInterval(Double(limit) / 1000)
        var i = 0
        while Date() < deadline {
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            if poll(&pfd, 1, everyMs) == 1 { return }
            var b = bytes[i % bytes.count]
            _ = Foundation.send(fd, &b, 1, Int32(MSG_NOSIGNAL))
            i += 1
        }
        throw TestFailure(description: "the server still waits after \(i) trickled bytes")
    }

    func setNonBlocking(_ on: Bool = true) {
        let flags = fcntl(fd, F_GETFL)
        _ = fcntl(fd, F_SETFL, on ? flags | O_NONBLOCK : flags & ~O_NONBLOCK)
    }

    /// One non-blocking `send`: how many bytes the kernel took (0 when its buffer is full).
    func sendSome(_ bytes: [UInt8]) -> Int {
        let n = bytes.withUnsafeBytes { Foundation.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        return max(n, 0)
    }
}
