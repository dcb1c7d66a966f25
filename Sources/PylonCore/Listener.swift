import CLibUV

#if canImport(Glibc)
import Glibc
#endif

/// A listening Unix socket (`uv_pipe_bind` + `uv_listen`).
public final class Listener: UVHandleOwner {
    let handle = UVHandle<uv_pipe_t>()
    public let path: String
    public var onConnection: () -> Void = {}
    let loop: Loop
    /// Connections accepted in one loop turn at most. The rest wait in the kernel's backlog:
    /// libuv stops watching the socket until `uv_accept` is called again, on the next turn, so a
    /// connect flood cannot keep the loop from serving the clients it already has.
    public static let maxAcceptsPerTurn = 32
    /// Pending connections the kernel holds while the host paces its accepts (capped by
    /// net.core.somaxconn); a client connecting during a flood waits here instead of failing.
    public static let defaultBacklog: Int32 = 1024
    private var acceptedInTurn = 0
    private var acceptTurn: UInt64 = 0
    private var resumeScheduled = false

    /// Binds `path` (removing a stale socket file first) and applies `mode`/`group` to it.
    public init(loop: Loop, path: String, mode: mode_t, group: gid_t?, backlog: Int32 = Listener.defaultBacklog) throws(UVError) {
        self.path = path
        self.loop = loop
        uv_pipe_init(loop.uv, handle.pointer, 0)
        handle.retain(self)
        // A socket file left by a process that is gone is removed; one that still answers belongs
        // to a live server (another pylond): never take it over.
        var st = stat()
        if lstat(path, &st) == 0, (st.st_mode & S_IFMT) == S_IFSOCK {
            // Non-blocking: a listener whose backlog is full (a connect flood) is live too, and
            // must not make this start wait forever.
            if case .live(let pid) = System.probeUnixSocket(path) {
                close(unlinking: false)
                let who = pid.map { "process \($0)" } ?? "another live process (its backlog is full)"
                throw UVError(-EADDRINUSE, "\(path) is served by \(who): is another pylond running? Stop it first")
            }
            unlink(path)
        }
        // Bind with a restrictive umask so the socket never exists with looser permissions.
        let old = umask(0o177)
        let rc = uv_pipe_bind(handle.pointer, path)
        umask(old)
        if rc < 0 { close(unlinking: false); throw UVError(rc, "bind \(path)") }
        do throws(IOError) {
            _ = try System.syscall("chmod \(path)") { chmod(path, mode) }
            if let group { _ = try System.syscall("chown \(path)") { chown(path, uid_t.max, group) } }
        } catch {
            close()
            throw UVError(error)
        }
        let lrc = uv_listen(asStream(handle.pointer), backlog) { s, status in
            guard status == 0 else { return }
            Unmanaged<Listener>.fromOpaque(s!.pointee.data).takeUnretainedValue().connectionReady()
        }
        if lrc < 0 { close(); throw UVError(lrc, "listen \(path)") }
    }

    /// A connection is waiting: hand it to `onConnection` (which accepts it), unless this turn's
    /// budget is spent; then it stays pending (libuv pauses the socket) until the next turn.
    private func connectionReady() {
        if acceptTurn != loop.turn {
            acceptTurn = loop.turn
            acceptedInTurn = 0
        }
        guard acceptedInTurn < Listener.maxAcceptsPerTurn else {
            if !resumeScheduled {
                resumeScheduled = true
                loop.nextTurn { [weak self] in
                    guard let self, !self.handle.isClosing else { return }
                    self.resumeScheduled = false
                    self.acceptTurn = self.loop.turn
                    self.acceptedInTurn = 0
                    self.connectionReady()
                }
            }
            return
        }
        acceptedInTurn += 1
        onConnection()
    }

    /// Accepts a pending connection into a new `Connection` (`uv_accept`).
    public func accept(loop: Loop, maxLineBytes: Int) -> Connection? {
        let c = Connection(loop: loop, maxLineBytes: maxLineBytes)
        loop.preconditionInLoop()
        if uv_accept(asStream(handle.pointer), c.stream) != 0 {
            c.close()
            return nil
        }
        return c
    }

    /// Stops listening and removes the socket file (only a socket this listener bound).
    public func close() { close(unlinking: true) }

    private func close(unlinking: Bool) {
        guard !handle.isClosing else { return }
        if unlinking { unlink(path) }
        handle.close()
    }
}

/// Peer credentials of a connected Unix socket (SO_PEERCRED).
public struct PeerCredentials: Sendable, Equatable {
    public var pid: Int32
    public var uid: UInt32
    public var gid: UInt32
    public init(pid: Int32, uid: UInt32, gid: UInt32) { self.pid = pid; self.uid = uid; self.gid = gid }

    public static func of(fd: Int32) -> PeerCredentials? {
        var pid: Int32 = 0
        var uid: UInt32 = 0
        var gid: UInt32 = 0
        guard fd >= 0, pylon_peercred(fd, &pid, &uid, &gid) == 0 else { return nil }
        return PeerCredentials(pid: pid, uid: uid, gid: gid)
    }
}
