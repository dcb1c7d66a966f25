import Testing

@testable import PylonCore

#if canImport(Glibc)
import Glibc
#endif

/// `System.probeUnixSocket`: the check a second pylond makes before it takes a socket path.
@Suite struct SocketProbeTests {
    func bindUnix(_ path: String) -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        var sa = sockaddr_un()
        sa.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &sa.sun_path) { raw in
            raw.copyBytes(from: Array(path.utf8))
            raw[path.utf8.count] = 0
        }
        let rc = withUnsafePointer(to: &sa) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        #expect(rc == 0)
        return fd
    }

    /// A listener whose backlog is full answers at once (live), instead of making the caller
    /// wait in `connect()` forever; a socket file nobody listens on is not live.
    /// A live listener with room in its backlog is named by its pid.
    @Test func aLiveListenerIsNamedByItsPid() throws {
        let path = "/tmp/pylon-probe-pid-\(getpid()).sock"
        unlink(path)
        defer { unlink(path) }
        let listener = bindUnix(path)
        defer { close(listener) }
        #expect(listen(listener, 8) == 0)
        #expect(System.probeUnixSocket(path) == .live(pid: getpid()))
    }

    @Test func aFullBacklogIsLiveAndAStaleSocketIsNot() throws {
        let path = "/tmp/pylon-probe-\(getpid()).sock"
        unlink(path)
        defer { unlink(path) }
        let listener = bindUnix(path)
        #expect(listen(listener, 0) == 0)
        var filled: [Int32] = []
        defer { filled.forEach { _ = close($0) } }
        // Fill the backlog with non-blocking connects until the kernel says EAGAIN.
        for _ in 0..<64 {
            guard let fd = try? System.connectUnixSocket(path, nonBlocking: true) else { break }
            filled.append(fd)
        }
        #expect(throws: IOError.self) { try System.connectUnixSocket(path, nonBlocking: true) }
        #expect(System.probeUnixSocket(path) == .live(pid: nil), "a flooded listener is live; a full backlog names no pid")
        close(listener)
        #expect(System.probeUnixSocket(path) == .stale, "a socket file without a listener is stale")
        #expect(System.probeUnixSocket(path + ".missing") == .stale)
    }
}
