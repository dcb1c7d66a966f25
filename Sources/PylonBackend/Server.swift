import CLibUV
import PylonCore

#if canImport(Glibc)
import Glibc
#endif

/// A listening TCP socket (`uv_tcp_bind` + `uv_listen`) that accepts `HTTPConnection`s, at most
/// `maxConnections` at a time, and hands their requests to `handler`.
///
/// The connection limit cannot be exhausted by connections that only hold a slot (idle, or
/// trickling a request): at the limit, a new connection makes room by closing the least
/// recently active one (`HTTPConnection.evictionRank`: lingering first, then the longest
/// since its last complete request or completed write). Activity is what a client finished,
/// never partial bytes, so a slow or idle client loses its slot before a busy one; a loopback
/// backend has one peer address, so a per-peer limit would not help. Only when every
/// connection has a response held back by injected latency is the new one refused with 503.
package final class Server: UVHandleOwner {
    let loop: Loop
    let handle = UVHandle<uv_tcp_t>()
    let maxBody: Int
    let maxConnections: Int
    let timeouts: Timeouts
    let handler: (HTTPRequest) -> Disposition
    private var connections: [ObjectIdentifier: HTTPConnection] = [:]
    private var accepted: UInt64 = 0
    /// Response bytes queued across connections (`--max-output-bytes`).
    package let outputBudget = OutputBudget(limit: Limits.defaultMaxOutputBytes)
    private var closed = false
    private let log = Log("server")

    /// Binds `host:port` (IPv4 or IPv6 literal; port 0 picks a free port) and listens.
    package init(
        loop: Loop, host: String, port: UInt16, maxBody: Int, maxConnections: Int, timeouts: Timeouts,
        handler: @escaping (HTTPRequest) -> Disposition
    ) throws(UVError) {
        self.loop = loop
        self.maxBody = maxBody
        self.maxConnections = maxConnections
        self.timeouts = timeouts
        self.handler = handler
        uv_tcp_init(loop.uv, handle.pointer)
        handle.retain(self)

        var addr = sockaddr_storage()
        let rc = withUnsafeMutablePointer(to: &addr) { p in
            let raw = UnsafeMutableRawPointer(p)
            if host.contains(":") {
                return uv_ip6_addr(host, Int32(port), raw.assumingMemoryBound(to: sockaddr_in6.self))
            }
            return uv_ip4_addr(host, Int32(port), raw.assumingMemoryBound(to: sockaddr_in.self))
        }
        if rc < 0 { close(); throw UVError(rc, "address \(host)") }
        let brc = withUnsafePointer(to: &addr) { p in
            uv_tcp_bind(handle.pointer, UnsafeRawPointer(p).assumingMemoryBound(to: sockaddr.self), 0)
        }
        if brc < 0 { close(); throw UVError(brc, "bind \(host):\(port)") }
        let lrc = uv_listen(asStream(handle.pointer), Limits.listenBacklog) { s, status in
            Unmanaged<Server>.fromOpaque(s!.pointee.data).takeUnretainedValue().accept(status)
        }
        if lrc < 0 { close(); throw UVError(lrc, "listen \(host):\(port)") }
    }

    /// The bound address as `HOST:PORT` (`[HOST]:PORT` for IPv6), from `uv_tcp_getsockname`.
    package var boundAddress: String {
        var addr = sockaddr_storage()
        var len = Int32(MemoryLayout<sockaddr_storage>.size)
        var name = [CChar](repeating: 0, count: 64)
        return withUnsafeMutablePointer(to: &addr) { p -> String in
            let raw = UnsafeMutableRawPointer(p)
            guard uv_tcp_getsockname(handle.pointer, raw.assumingMemoryBound(to: sockaddr.self), &len) == 0 else { return "?" }
            if Int32(p.pointee.ss_family) == AF_INET6 {
                let a = raw.assumingMemoryBound(to: sockaddr_in6.self)
                uv_ip6_name(a, &name, name.count)
                return "[\(cString(name))]:\(UInt16(bigEndian: a.pointee.sin6_port))"
            }
            let a = raw.assumingMemoryBound(to: sockaddr_in.self)
            uv_ip4_name(a, &name, name.count)
            return "\(cString(name)):\(UInt16(bigEndian: a.pointee.sin_port))"
        }
    }

    private func accept(_ status: Int32) {
        guard status == 0, !closed else {
            log.warn("accept failed", ["error": UVError(status).description])
            return
        }
        accepted += 1
        let c = HTTPConnection(loop: loop, maxBody: maxBody, timeouts: timeouts, serial: accepted)
        c.budget = outputBudget
        let rc = uv_accept(asStream(handle.pointer), c.stream)
        guard rc == 0 else {
            log.warn("accept failed", ["error": UVError(rc).description])
            c.close()
            return
        }
        let full = APIError(status: 503, code: .tooManyConnections, message: "more than \(maxConnections) open connections")
        if connections.count >= maxConnections {
            guard let victim = leastRecentlyActive() else {
                log.warn("connection refused: too many connections", ["limit": maxConnections])
                c.refuse(full)
                return
            }
            log.info(
                "connection limit: closing the least recently active connection",
                ["limit": maxConnections, "idleMs": loop.nowMs - min(loop.nowMs, victim.deadlines.idleSince)])
            victim.evict(full)  // leaves `connections` at once (`onClose`)
        }
        let id = ObjectIdentifier(c)
        connections[id] = c
        c.handler = { [unowned self] request in self.handler(request) }
        c.onClose = { [weak self] in self?.connections[id] = nil }
        c.start()
    }

    /// The connection to close to make room, if any may be closed.
    private func leastRecentlyActive() -> HTTPConnection? {
        var best: (HTTPConnection, (tier: Int, idleSince: UInt64, serial: UInt64))?
        for c in connections.values {
            guard let rank = c.evictionRank else { continue }
            if best == nil || rank < best!.1 { best = (c, rank) }
        }
        return best?.0
    }

    /// Stops listening and closes every connection at once.
    package func close() {
        guard !closed else { return }
        closed = true
        for c in connections.values { c.close() }
        handle.close()
    }
}

/// The text before the first NUL of a C character array.
private func cString(_ chars: [CChar]) -> String {
    String(decoding: chars.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}
