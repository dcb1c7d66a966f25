import FuzzSupport
import PylonBackend
import PylonCore

#if canImport(Glibc)
import Glibc
#endif

/// Fuzz target (c): the reference backend's whole request path, unchanged. One backend (its
/// `Server`, `HTTPConnection` with the http-parser callbacks, `Backend` routing and decoding:
/// gzip, JSON, batch and MA bodies, faults, and a SQLite store in a temporary file) runs on a
/// libuv loop in this process. Each input is written as the bytes of one TCP connection on
/// loopback (then the client shuts down its sending side); the harness turns the loop until the
/// backend closes the connection and reads every response.
///
/// Properties: nothing traps (a trap or sanitizer report is a finding); every connection ends
/// (the backend answers or closes within its deadlines, set short here); every response starts
/// with an HTTP/1.1 status line.
struct Harness {
    static let operatorToken = "fuzz-operator-token-0123456789"
    static let deviceKey = "fuzz-device-key-0123456789"
    let loop = Loop()
    let server: Server
    let backend: Backend
    let port: UInt16

    init() {
        Log.minimum = .error
        System.ignoreSIGPIPE()
        let db = "/tmp/pylon-fuzz-backend-\(getpid()).db"
        unlink(db)
        let options = try! Options.parse([
            "--listen", "127.0.0.1:0", "--db", db, "--max-body", "65536", "--max-connections", "16",
            "--idle-timeout-ms", "500", "--header-timeout-ms", "500", "--body-timeout-ms", "500",
        ])
        let store = try! Store(path: options.dbPath)
        backend = Backend(store: store, maxBody: options.maxBody)
        // The credentials the corpus presents (`Authorization: Bearer …`), so that inputs reach
        // the handlers behind the authentication, and the fault API the corpus drives.
        backend.credentials.operatorToken = Array(Harness.operatorToken.utf8)
        backend.credentials.enrolSecret = Array(Harness.deviceKey.utf8)
        backend.faultsEnabled = true
        server = try! Server(
            loop: loop, host: options.host, port: options.port, maxBody: options.maxBody,
            maxConnections: options.maxConnections, timeouts: options.timeouts,
            handler: { [backend] in backend.handle($0) })
        let address = server.boundAddress
        port = UInt16(address[address.index(after: address.lastIndex(of: ":")!)...])!
    }

    /// Sends `bytes` on a new connection, half-closes, and returns everything the backend wrote
    /// before closing. Traps if the backend has not closed within 5 s.
    func exchange(_ bytes: UnsafeRawBufferPointer) -> [UInt8] {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        fuzzCheck(fd >= 0, "socket failed")
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = port.bigEndian
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        defer { close(fd) }
        // Non-blocking connect: libFuzzer's timers (SIGALRM) would interrupt a blocking one.
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        let rc = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        if rc != 0 {
            fuzzCheck(errno == EINPROGRESS || errno == EINTR, "connect failed: errno \(errno)")
            var w = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
            while poll(&w, 1, 5_000) < 0 && errno == EINTR {}
            var err: Int32 = 0
            var len = socklen_t(MemoryLayout<Int32>.size)
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len)
            fuzzCheck(w.revents & Int16(POLLOUT) != 0 && err == 0, "connect failed: SO_ERROR \(err)")
        }

        var sent = 0
        var out: [UInt8] = []
        var buf = [UInt8](repeating: 0, count: 65536)
        var halfClosed = false
        let deadline = Loop.hrtimeNs + 5_000_000_000
        var spins = 0
        while true {
            if sent < bytes.count {
                let n = send(fd, bytes.baseAddress! + sent, bytes.count - sent, Int32(MSG_NOSIGNAL))
                if n > 0 { sent += n } else if errno != EAGAIN { sent = bytes.count }
            }
            if sent >= bytes.count && !halfClosed {
                shutdown(fd, Int32(SHUT_WR))
                halfClosed = true
            }
            let n = recv(fd, &buf, buf.count, 0)
            if n > 0 {
                out.append(contentsOf: buf[0..<n])
                continue
            }
            if n == 0 || (n < 0 && errno != EAGAIN) { break }
            fuzzCheck(Loop.hrtimeNs < deadline, "the backend neither answered nor closed within 5 s")
            loop.runNoWait()
            var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            spins += 1
            _ = poll(&p, 1, spins < 64 ? 0 : 1)
        }
        // Let the backend see the close and release the connection.
        for _ in 0..<4 { loop.runNoWait() }
        return out
    }
}

nonisolated(unsafe) let harness = Harness()
let clearFaults: [UInt8] = Array("DELETE /v1/faults HTTP/1.1\r\nHost: f\r\nConnection: close\r\n\r\n".utf8)

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data, size > 0 else { return 0 }
    let input = UnsafeRawBufferPointer(start: data, count: size)
    let out = harness.exchange(input)
    if !out.isEmpty {
        fuzzCheck(out.starts(with: Array("HTTP/1.1 ".utf8)), "response does not start with a status line")
    }
    // Injected faults (latency up to 10 min, failures, drops) would outlive this input: clear
    // them whenever the input could have set some (the path may be percent-encoded).
    if input.contains(UInt8(ascii: "%")) || input.contains(UInt8(ascii: "f")) || input.contains(UInt8(ascii: "F")) {
        clearFaults.withUnsafeBytes { _ = harness.exchange($0) }
    }
    return 0
}

@main struct Main {
    static func main() { FuzzMain.run(fuzzOne) }
}
