import Foundation
import PylonClientKit
import TestSupport

/// A parsed HTTP/1.1 response.
struct HTTPReply {
    var status: Int
    /// Lower-cased names.
    var headers: [String: String]
    var body: [UInt8]

    var text: String { String(decoding: body, as: UTF8.self) }
    func json() throws -> JSON { try JSON.parse(text) }
}

/// A minimal blocking HTTP/1.1 client over a raw TCP socket, so tests control exactly what
/// is sent (pipelining, malformed requests, split writes) and see exactly what comes back.
final class RawHTTPClient {
    let fd: Int32
    private var buffer: [UInt8] = []

    /// `receiveBuffer`: `SO_RCVBUF` set before connecting (a small window keeps unread
    /// responses in the server rather than in the kernel).
    init(port: UInt16, receiveBuffer: Int32? = nil) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw TestFailure(description: "socket: \(errno)") }
        if var n = receiveBuffer { setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &n, socklen_t(MemoryLayout<Int32>.size)) }
        var sa = sockaddr_in()
        sa.sin_family = sa_family_t(AF_INET)
        sa.sin_port = port.bigEndian
        sa.sin_addr.s_addr = inet_addr("127.0.0.1")
        let rc = withUnsafePointer(to: &sa) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard rc == 0 else {
            close(fd)
            throw TestFailure(description: "connect to port \(port): errno \(errno)")
        }
    }

    deinit { close(fd) }

    /// Serialises a request; `Content-Length` is added for a non-empty body unless given.
    static func message(_ method: String, _ target: String, headers: [(String, String)] = [], body: [UInt8] = []) -> [UInt8] {
        var head = "\(method) \(target) HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        var headers = headers
        if !headers.contains(where: { $0.0.lowercased() == "authorization" }), let h = TestCredentials.header(for: target) {
            headers.append(h)
        }
        for (k, v) in headers where !(k.lowercased() == "authorization" && v.isEmpty) { head += "\(k): \(v)\r\n" }
        let hasLength = headers.contains { $0.0.lowercased() == "content-length" || $0.0.lowercased() == "transfer-encoding" }
        if !hasLength && (!body.isEmpty || method == "POST") { head += "Content-Length: \(body.count)\r\n" }
        head += "\r\n"
        return Array(head.utf8) + body
    }

    func send(_ bytes: [UInt8]) throws {
        var off = 0
        while off < bytes.count {
            let n = bytes[off...].withUnsafeBytes { Foundation.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard n > 0 else { throw TestFailure(description: "send failed: errno \(errno)") }
            off += n
        }
    }
    func send(_ s: String) throws { try send(Array(s.utf8)) }

    func request(_ method: String, _ target: String, headers: [(String, String)] = [], body: [UInt8] = []) throws -> HTTPReply {
        try send(RawHTTPClient.message(method, target, headers: headers, body: body))
        guard let r = try readResponse() else { throw TestFailure(description: "connection closed without a response") }
        return r
    }

    func postBatch(_ stream: String, key: String?, _ body: JSON) throws -> HTTPReply {
        try request(
            "POST", "/v1/batches/\(stream)", headers: key.map { [("Idempotency-Key", $0)] } ?? [],
            body: Array(body.serialized.utf8))
    }

    /// Reads one response (Content-Length bodies only, as the backend sends); nil when the
    /// server closed the connection before any byte of it. `toHEAD`: the response to a HEAD
    /// request, which has no body whatever its Content-Length says.
    func readResponse(timeoutMs: Int32 = 10_000, toHEAD: Bool = false) throws -> HTTPReply? {
        guard let headEnd = try fill(until: { self.find([13, 10, 13, 10]) }, timeoutMs: timeoutMs) else {
            if buffer.isEmpty { return nil }
            throw TestFailure(description: "truncated response head: \(String(decoding: buffer, as: UTF8.self))")
        }
        let head = String(decoding: buffer[..<headEnd], as: UTF8.self)
        var lines = head.components(separatedBy: "\r\n")
        let statusLine = lines.removeFirst().split(separator: " ")
        guard statusLine.count >= 2, let status = Int(statusLine[1]) else {
            throw TestFailure(description: "bad status line in \(head)")
        }
        var headers: [String: String] = [:]
        for l in lines {
            guard let c = l.firstIndex(of: ":") else { continue }
            headers[l[..<c].lowercased()] = l[l.index(after: c)...].trimmingCharacters(in: .whitespaces)
        }
        let length = toHEAD ? 0 : Int(headers["content-length"] ?? "0") ?? 0
        let total = headEnd + 4 + length
        guard try fill(until: { self.buffer.count >= total ? total : nil }, timeoutMs: timeoutMs) != nil else {
            throw TestFailure(description: "truncated body (status \(status))")
        }
        let body = Array(buffer[(headEnd + 4)..<total])
        buffer.removeFirst(total)
        return HTTPReply(status: status, headers: headers, body: body)
    }

    /// True when the server has closed the connection (EOF within `timeoutMs`, nothing unread).
    func isClosedByPeer(timeoutMs: Int32 = 5_000) throws -> Bool {
        var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard poll(&pfd, 1, timeoutMs) == 1 else { return false }
        var b = [UInt8](repeating: 0, count: 4096)
        let n = recv(fd, &b, b.count, 0)
        if n > 0 { buffer.append(contentsOf: b[..<n]) }
        return n <= 0
    }

    private func find(_ pattern: [UInt8]) -> Int? {
        guard buffer.count >= pattern.count else { return nil }
        for i in 0...(buffer.count - pattern.count) where buffer[i..<(i + pattern.count)].elementsEqual(pattern) { return i }
        return nil
    }

    /// Reads until `until` returns a value; nil on EOF or error.
    private func fill(until: () -> Int?, timeoutMs: Int32) throws -> Int? {
        let deadline = Date().addingTimeInterval(Double(timeoutMs) / 1000)
        while true {
            if let v = until() { return v }
            let left = Int32(max(0, deadline.timeIntervalSinceNow * 1000))
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&pfd, 1, left) == 1 else { throw TestFailure(description: "no response within \(timeoutMs) ms") }
            var b = [UInt8](repeating: 0, count: 65536)
            let n = recv(fd, &b, b.count, 0)
            if n <= 0 { return nil }
            buffer.append(contentsOf: b[..<n])
        }
    }
}
