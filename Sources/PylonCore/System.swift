import CLibUV

#if canImport(Glibc)
import Glibc
#endif

/// Small wrappers over process-level system calls.
public enum System {
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

    public static func close(_ fd: Int32) { _ = Glibc.close(fd) }

    /// A connected, close-on-exec Unix stream socket (`socket` + blocking `connect`).
    public static func connectUnix(_ path: String) throws(UVError) -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        if fd < 0 { throw UVError(-errno, "socket") }
        var sa = sockaddr_un()
        sa.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: sa.sun_path) else {
            _ = Glibc.close(fd)
            throw UVError(-ENAMETOOLONG, "socket path \(path)")
        }
        withUnsafeMutableBytes(of: &sa.sun_path) { raw in
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        let rc = withUnsafePointer(to: &sa) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        if rc != 0 {
            let e = errno
            _ = Glibc.close(fd)
            throw UVError(-e, "connect \(path)")
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

    /// Reads a whole file (`open`/`read`), or nil.
    public static func readFile(_ path: String, limit: Int = 16 << 20) -> [UInt8]? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { _ = Glibc.close(fd) }
        var out: [UInt8] = []
        var buf = [UInt8](repeating: 0, count: 65536)
        while out.count <= limit {
            let n = buf.withUnsafeMutableBytes { read(fd, $0.baseAddress, 65536) }
            if n < 0 { if errno == EINTR { continue }; return nil }
            if n == 0 { break }
            out.append(contentsOf: buf[0..<n])
        }
        return out
    }

    /// Writes a file atomically: temp file, fsync, rename, fsync of the directory.
    public static func writeFileAtomically(_ path: String, _ bytes: [UInt8], mode: mode_t = 0o600) -> Bool {
        let tmp = path + ".tmp"
        let fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode)
        guard fd >= 0 else { return false }
        var off = 0
        while off < bytes.count {
            let n = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + off, bytes.count - off) }
            if n < 0 { if errno == EINTR { continue }; _ = Glibc.close(fd); return false }
            off += n
        }
        guard fsync(fd) == 0 else { _ = Glibc.close(fd); return false }
        _ = Glibc.close(fd)
        guard rename(tmp, path) == 0 else { return false }
        let dir = path.split(separator: "/", omittingEmptySubsequences: false).dropLast().joined(separator: "/")
        let dfd = open(dir.isEmpty ? "." : dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if dfd >= 0 { fsync(dfd); _ = Glibc.close(dfd) }
        return true
    }

    /// `mkdir -p` with `mode` for created directories.
    public static func makeDirectories(_ path: String, mode: mode_t = 0o755) -> Bool {
        var cur = path.hasPrefix("/") ? "" : "."
        for part in path.split(separator: "/") {
            cur += "/" + part
            if mkdir(cur, mode) != 0 && errno != EEXIST { return false }
        }
        return true
    }

    public static var pid: Int32 { getpid() }
    public static func exit(_ code: Int32) -> Never { Glibc.exit(code) }
}

extension System {
    /// The directory holding the running executable (`readlink /proc/self/exe`).
    public static func executableDirectory() -> String? {
        var buf = [CChar](repeating: 0, count: 4096)
        let n = readlink("/proc/self/exe", &buf, buf.count - 1)
        guard n > 0 else { return nil }
        let path = String(decoding: buf[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        guard let slash = path.lastIndex(of: "/") else { return nil }
        return String(path[..<slash])
    }

    /// Resident set size of this process in KiB (from /proc/self/status), or nil.
    /// Returns free heap memory to the system (glibc `malloc_trim`): after a burst, freed
    /// memory would otherwise stay in the process.
    public static func releaseFreeMemory() { _ = pylon_malloc_trim() }

    public static func rssKiB(pid: Int32? = nil) -> Int? {
        let path = pid.map { "/proc/\($0)/status" } ?? "/proc/self/status"
        guard let bytes = readFile(path) else { return nil }
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
