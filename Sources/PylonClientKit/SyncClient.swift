@_exported import PylonCore
import PylonProtocol

#if canImport(Glibc)
import Glibc
#endif

/// Where clients find the host: `$PYLON_SOCKET`, else the packaged default.
public func defaultSocketPath() -> String {
    if let s = System.env("PYLON_SOCKET"), !s.isEmpty { return s }
    return "/run/pylon/pylon.sock"
}

public struct ClientError: Error, CustomStringConvertible, Sendable {
    public enum Kind: Sendable { case connect, io, timeout, closed, protocolError }
    public let kind: Kind
    public let description: String
    public init(_ kind: Kind, _ d: String) { self.kind = kind; description = d }
}

/// A blocking client for scripts, the CLI and tests: one socket, one call at a time (or raw
/// lines for protocol tests). Notifications that arrive while waiting are kept in `notifications`.
public final class SyncClient {
    public let fd: Int32
    private var buffer: [UInt8] = []
    private var nextId: Int64 = 1
    public var notifications: [JSON] = []
    public let path: String

    public init(path: String = defaultSocketPath()) throws(ClientError) {
        self.path = path
        do {
            fd = try System.connectUnix(path)
        } catch {
            throw ClientError(.connect, "cannot connect to \(path): \(error.message)")
        }
    }

    deinit { Glibc.close(fd) }

    /// Writes bytes as they are (a `\n` is not added).
    public func sendRaw(_ bytes: [UInt8]) throws(ClientError) {
        var off = 0
        while off < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + off, bytes.count - off, Int32(MSG_NOSIGNAL)) }
            if n < 0 {
                if errno == EINTR { continue }
                throw ClientError(.io, "send: \(String(cString: strerror(errno)))")
            }
            off += n
        }
    }
    public func sendLine(_ s: String) throws(ClientError) { try sendRaw(Array(s.utf8) + [0x0A]) }
    /// Sends one envelope (`Envelope.request`, `.result`, …) as a line.
    public func send(envelope line: [UInt8]) throws(ClientError) { try sendRaw(line + [0x0A]) }

    /// Reads one line (without `\n`), waiting at most `timeoutMs`; nil on timeout.
    public func readLine(timeoutMs: Int = 10_000) throws(ClientError) -> String? {
        let deadline = SyncClient.deadline(afterMs: timeoutMs)
        while true {
            if let nl = buffer.firstIndex(of: 0x0A) {
                let line = String(decoding: buffer[..<nl], as: UTF8.self)
                buffer.removeSubrange(...nl)
                return line
            }
            let now = Loop.hrtimeNs
            if now >= deadline { return nil }
            var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let r = poll(&p, 1, Int32(min(UInt64(Int32.max), (deadline - now) / 1_000_000 + 1)))
            if r < 0 { if errno == EINTR { continue }; throw ClientError(.io, "poll failed") }
            if r == 0 { continue }
            var chunk = [UInt8](repeating: 0, count: 65536)
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, 65536, 0) }
            if n < 0 { if errno == EINTR { continue }; throw ClientError(.io, "recv: \(String(cString: strerror(errno)))") }
            if n == 0 { throw ClientError(.closed, "connection closed by host") }
            buffer.append(contentsOf: chunk[0..<n])
        }
    }

    /// Reads the next message as JSON; nil on timeout.
    public func readMessage(timeoutMs: Int = 10_000) throws(ClientError) -> JSON? {
        guard let line = try readLine(timeoutMs: timeoutMs) else { return nil }
        do {
            return try JSON.parse(line)
        } catch {
            throw ClientError(.protocolError, "unparseable line from host: \(error)")
        }
    }

    /// Sends a request and waits for its response message (result or error, whole).
    public func request(_ method: String, _ params: JSON? = nil, timeoutMs: Int = 30_000) throws(ClientError) -> JSON {
        let id = nextId
        nextId += 1
        try sendRaw(Envelope.request(id: .int(id), method: method, params: .params(params)) + [0x0A])
        let deadline = SyncClient.deadline(afterMs: timeoutMs)
        while true {
            let left = SyncClient.msLeft(until: deadline)
            guard left > 0, let m = try readMessage(timeoutMs: left) else {
                throw ClientError(.timeout, "no reply to \(method) within \(timeoutMs) ms")
            }
            if m["id"] == .int(id) && (m["result"] != nil || m["error"] != nil) { return m }
            if m["id"] == nil { notifications.append(m) }
        }
    }

    /// Calls a method: its result, or the error it returned as `RPCError`.
    public func call(_ method: String, _ params: JSON? = nil, timeoutMs: Int = 30_000) throws -> JSON {
        let m = try request(method, params, timeoutMs: timeoutMs)
        if let e = m["error"] {
            throw RPCError(
                code: Int32(truncatingIfNeeded: e["code"]?.intValue ?? -32603),
                message: e["message"]?.stringValue ?? "", data: e["data"])
        }
        return m["result"] ?? .null
    }

    /// The monotonic time `ms` from now (a negative `ms` is now; at most ~35 years: no overflow).
    static func deadline(afterMs ms: Int) -> UInt64 { Loop.hrtimeNs + UInt64(min(max(ms, 0), 1 << 40)) * 1_000_000 }

    /// Milliseconds left until `deadline`, rounded up; 0 once it has passed (a line read just
    /// after it must not wrap the difference around).
    static func msLeft(until deadline: UInt64) -> Int {
        let now = Loop.hrtimeNs
        return now >= deadline ? 0 : Int((deadline - now + 999_999) / 1_000_000)
    }

    /// Waits for a notification (already buffered or arriving within `timeoutMs`).
    public func nextNotification(timeoutMs: Int = 10_000) throws(ClientError) -> JSON? {
        if !notifications.isEmpty { return notifications.removeFirst() }
        let deadline = SyncClient.deadline(afterMs: timeoutMs)
        while true {
            let left = SyncClient.msLeft(until: deadline)
            guard left > 0, let m = try readMessage(timeoutMs: left) else { return nil }
            if m["id"] == nil { return m }
        }
    }
}
