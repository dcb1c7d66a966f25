import CLibUV

#if canImport(Glibc)
import Glibc
#endif

/// A failed system call: the `errno` it set and what was being done (the shape of swift-nio's
/// `IOError`). Thrown by `System`'s calls; `UVError(_:)` converts it for libuv-style callers.
public struct IOError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The `errno` value (positive: `ENOENT`, `EACCES`, …).
    public let errnoCode: Int32
    /// The call and its subject, e.g. `open /etc/pylon/pylon.json`.
    public let reason: String
    public init(errnoCode: Int32, reason: String) {
        self.errnoCode = errnoCode
        self.reason = reason
    }
    public var description: String { "\(reason): \(String(cString: strerror(errnoCode)))" }
}

extension UVError {
    /// The same failure as a libuv error (libuv codes are negated errno values on Unix).
    public init(_ e: IOError) { self.init(-e.errnoCode, e.reason) }
}

/// Process-level system calls. Every Glibc call that can fail goes through `syscall`, the one
/// place that retries `EINTR` and turns `-1`/`errno` into a thrown `IOError`.
public enum System {
    /// Runs `body` (a system call returning -1 and setting `errno` on failure), again while it
    /// fails with `EINTR`; any other failure throws `IOError(errno, reason())`. The reason is
    /// only built on failure.
    @inline(__always)
    public static func syscall<T: BinaryInteger>(
        _ reason: @autoclosure () -> String,
        _ body: () -> T
    ) throws(IOError) -> T {
        while true {
            let r = body()
            if r != -1 { return r }
            let e = errno
            if e == EINTR { continue }
            throw IOError(errnoCode: e, reason: reason())
        }
    }

    /// The value of an environment variable (`getenv`).
    public static func env(_ name: String) -> String? {
        guard let p = getenv(name) else { return nil }
        return String(cString: p)
    }

    /// The whole environment as `KEY=VALUE` strings.
    public static func environment() -> [String] {
        var out: [String] = []
        var p = Glibc.environ
        while let e = p.pointee {
            out.append(String(cString: e))
            p += 1
        }
        return out
    }

    /// A close-on-exec stream socketpair (`socketpair(AF_UNIX, SOCK_STREAM|SOCK_CLOEXEC)`).
    public static func socketPair() throws(UVError) -> (Int32, Int32) {
        var fds: [Int32] = [-1, -1]
        let rc = pylon_socketpair(&fds)
        if rc < 0 { throw UVError(rc, "socketpair") }
        return (fds[0], fds[1])
    }

    /// Closes a descriptor (`close`). Never retried: on Linux the descriptor is released even
    /// when `close` reports `EINTR`, and a retry could close a descriptor reused meanwhile.
    public static func close(_ fd: Int32) { _ = Glibc.close(fd) }

    /// A connected, close-on-exec Unix stream socket (`socket` + blocking `connect`).
    public static func connectUnix(_ path: String) throws(UVError) -> Int32 {
        do throws(IOError) { return try connectUnixSocket(path) } catch { throw UVError(error) }
    }

    /// A connected, close-on-exec Unix stream socket (`socket` + blocking `connect`; an
    /// interrupted `connect` of an `AF_UNIX` socket left it unconnected and is retried).
    public static func connectUnixSocket(_ path: String) throws(IOError) -> Int32 {
        try connectUnixSocket(path, nonBlocking: false)
    }

    /// Whether a live process listens on a Unix socket, found by a non-blocking connect that never
    /// waits, even when the listener is flooded: accepted into its backlog (live, with the pid
    /// `SO_PEERCRED` names: the process that called `listen`), or refused only because the
    /// backlog is full (`EAGAIN`: live, pid unknown). `ECONNREFUSED` (a stale socket file) and
    /// every other error: stale.
    public enum SocketProbe: Equatable, Sendable {
        case stale
        case live(pid: Int32?)
    }

    public static func probeUnixSocket(_ path: String) -> SocketProbe {
        do throws(IOError) {
            let fd = try connectUnixSocket(path, nonBlocking: true)
            defer { close(fd) }
            return .live(pid: PeerCredentials.of(fd: fd).map(\.pid).flatMap { $0 > 0 ? $0 : nil })
        } catch {
            return error.errnoCode == EAGAIN || error.errnoCode == EINPROGRESS ? .live(pid: nil) : .stale
        }
    }

    static func connectUnixSocket(_ path: String, nonBlocking: Bool) throws(IOError) -> Int32 {
        let type = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | (nonBlocking ? Int32(SOCK_NONBLOCK.rawValue) : 0)
        let fd = try syscall("socket") { socket(AF_UNIX, type, 0) }
        var sa = sockaddr_un()
        sa.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: sa.sun_path) else {
            close(fd)
            throw IOError(errnoCode: ENAMETOOLONG, reason: "socket path \(path)")
        }
        withUnsafeMutableBytes(of: &sa.sun_path) { raw in
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        do throws(IOError) {
            _ = try syscall("connect \(path)") {
                withUnsafePointer(to: &sa) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                        Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
                    }
                }
            }
        } catch {
            close(fd)
            throw error
        }
        return fd
    }

    /// Clears the inherited signal mask: a parent that blocked SIGTERM (test runners, some
    /// supervisors) must not leave the daemon deaf to it.
    public static func unblockAllSignals() {
        var set = sigset_t()
        sigemptyset(&set)
        sigprocmask(SIG_SETMASK, &set, nil)
    }

    /// Ignores SIGPIPE so a peer that vanishes mid-write yields EPIPE, not death.
    public static func ignoreSIGPIPE() { signal(SIGPIPE, SIG_IGN) }

    /// Sends `message` to systemd's notify socket when `NOTIFY_SOCKET` is set (plain sd_notify
    /// protocol, no libsystemd needed). Returns false when not under systemd or on error.
    @discardableResult
    public static func sdNotify(_ message: String) -> Bool {
        guard let path = env("NOTIFY_SOCKET") else { return false }
        return pylon_sd_notify(path, message) == 0
    }

    /// Reads a whole file (`open`, `read`). Throws `IOError` (`ENOENT`, `EACCES`, …), and
    /// `EFBIG` when the file holds more than `maxBytes`.
    public static func readFile(atPath path: String, maxBytes: Int = 16 << 20) throws(IOError) -> [UInt8] {
        let (bytes, truncated) = try readAll(path, limit: maxBytes)
        if truncated { throw IOError(errnoCode: EFBIG, reason: "read \(path): more than \(maxBytes) bytes") }
        return bytes
    }

    /// Reads `path` in 64 KiB chunks until its end or until more than `limit` bytes were read
    /// (`truncated`: then about `limit` + 64 KiB of it is returned).
    private static func readAll(_ path: String, limit: Int) throws(IOError) -> (bytes: [UInt8], truncated: Bool) {
        let fd = try syscall("open \(path)") { open(path, O_RDONLY | O_CLOEXEC) }
        defer { close(fd) }
        var out: [UInt8] = []
        let chunk = 65536
        let buf = UnsafeMutableRawPointer.allocate(byteCount: chunk, alignment: 1)
        defer { buf.deallocate() }
        while true {
            let n = try syscall("read \(path)") { read(fd, buf, chunk) }
            if n == 0 { return (out, false) }
            out.append(contentsOf: UnsafeRawBufferPointer(start: buf, count: n))
            if out.count > limit { return (out, true) }
        }
    }

    /// Writes a file atomically: a temporary file beside it, `fsync`, `rename` over `path`, then
    /// `fsync` of the directory (best effort: the rename is already done).
    ///
    /// The temporary file `<path>.tmp` is always a new file (`O_CREAT|O_EXCL|O_NOFOLLOW`): one
    /// left behind, or a symlink someone planted there in a directory they may write, is removed
    /// first (the link itself, never its target), so the write never goes through a link. If it
    /// is planted again in between, the write fails instead. `rename` replaces `path` itself,
    /// a symlink included, without following it. The file gets exactly `mode` (not the umask's).
    public static func writeFileAtomically(atPath path: String, contents bytes: [UInt8], mode: mode_t = 0o600) throws(IOError) {
        let tmp = path + ".tmp"
        let flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC
        var fd = open(tmp, flags, mode)
        if fd < 0, errno == EEXIST {
            _ = unlink(tmp)
            fd = open(tmp, flags, mode)
        }
        if fd < 0 { throw IOError(errnoCode: errno, reason: "open \(tmp)") }
        _ = fchmod(fd, mode)
        do throws(IOError) {
            var off = 0
            while off < bytes.count {
                let n = try syscall("write \(tmp)") { bytes.withUnsafeBytes { write(fd, $0.baseAddress! + off, bytes.count - off) } }
                off += n
            }
            _ = try syscall("fsync \(tmp)") { fsync(fd) }
        } catch {
            close(fd)
            _ = unlink(tmp)
            throw error
        }
        close(fd)
        _ = try syscall("rename \(tmp)") { rename(tmp, path) }
        let dir = path.split(separator: "/", omittingEmptySubsequences: false).dropLast().joined(separator: "/")
        if let dfd = try? syscall("open", { open(dir.isEmpty ? "." : dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) }) {
            _ = try? syscall("fsync", { fsync(dfd) })
            close(dfd)
        }
    }

    /// `mkdir -p`: creates `path` and missing parents with `mode`. An existing directory is
    /// fine; an existing non-directory throws `ENOTDIR`.
    public static func createDirectories(atPath path: String, mode: mode_t = 0o755) throws(IOError) {
        var cur = path.hasPrefix("/") ? "" : "."
        for part in path.split(separator: "/") {
            cur += "/" + part
            do throws(IOError) {
                _ = try syscall("mkdir \(cur)") { mkdir(cur, mode) }
            } catch  where error.errnoCode == EEXIST {
                var st = stat()
                _ = try syscall("stat \(cur)") { stat(cur, &st) }
                if st.st_mode & S_IFMT != S_IFDIR { throw IOError(errnoCode: ENOTDIR, reason: "mkdir \(cur)") }
            }
        }
    }

    // Older spellings, kept for callers not yet moved to the throwing calls above.

    /// `readFile(atPath:)` without the reason: nil on any error. Unlike the throwing call, a
    /// file larger than `limit` is not an error: about `limit` + 64 KiB of it is returned.
    public static func readFile(_ path: String, limit: Int = 16 << 20) -> [UInt8]? {
        try? readAll(path, limit: limit).bytes
    }

    /// `writeFileAtomically(atPath:contents:mode:)` returning false on any error.
    public static func writeFileAtomically(_ path: String, _ bytes: [UInt8], mode: mode_t = 0o600) -> Bool {
        (try? writeFileAtomically(atPath: path, contents: bytes, mode: mode)) != nil
    }

    /// `createDirectories(atPath:mode:)` returning false on any error.
    public static func makeDirectories(_ path: String, mode: mode_t = 0o755) -> Bool {
        (try? createDirectories(atPath: path, mode: mode)) != nil
    }

    public static var pid: Int32 { getpid() }
    public static func exit(_ code: Int32) -> Never { Glibc.exit(code) }
}

extension System {
    /// The directory holding the running executable (`readlink /proc/self/exe`).
    public static func executableDirectory() -> String? {
        var buf = [CChar](repeating: 0, count: 4096)
        guard let n = try? syscall("readlink", { readlink("/proc/self/exe", &buf, buf.count - 1) }), n > 0 else { return nil }
        let path = String(decoding: buf[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        guard let slash = path.lastIndex(of: "/") else { return nil }
        return String(path[..<slash])
    }

    /// Returns free heap memory to the system (glibc `malloc_trim`): after a burst, freed
    /// memory would otherwise stay in the process.
    public static func releaseFreeMemory() { _ = pylon_malloc_trim() }

    /// Resident set size of a process (this one by default) in KiB, from /proc/PID/status, or nil.
    public static func rssKiB(pid: Int32? = nil) -> Int? {
        let path = pid.map { "/proc/\($0)/status" } ?? "/proc/self/status"
        guard let bytes = try? readFile(atPath: path) else { return nil }
        let text = String(decoding: bytes, as: UTF8.self)
        for line in text.split(separator: "\n") where line.hasPrefix("VmRSS:") {
            return Int(line.dropFirst(6).filter { $0 >= "0" && $0 <= "9" })
        }
        return nil
    }
}

extension System {
    /// Wall-clock milliseconds since the Unix epoch (`clock_gettime(CLOCK_REALTIME)`).
    public static func wallClockMs() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec / 1_000_000)
    }

    /// `n` random bytes as lowercase hex, from the kernel (`getrandom`).
    public static func randomHex(_ n: Int) -> String {
        var b = [UInt8](repeating: 0, count: n)
        _ = b.withUnsafeMutableBytes { uv_random(nil, nil, $0.baseAddress, n, 0, nil) }  // synchronous (no callback)
        let digits = Array("0123456789abcdef".utf8)
        var out = [UInt8]()
        out.reserveCapacity(n * 2)
        for x in b { out.append(digits[Int(x >> 4)]); out.append(digits[Int(x & 15)]) }
        return String(decoding: out, as: UTF8.self)
    }
}
