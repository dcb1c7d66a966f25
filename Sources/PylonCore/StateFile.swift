#if canImport(Glibc)
import Glibc
#endif

/// The mode of every file a Pylon process keeps in its state directory (docs/SECURITY.md "File
/// modes"): owner read and write only, created so and tightened at start when an earlier release
/// (or an operator) left it looser. Nothing here follows a symlink: a state file is opened with
/// `O_NOFOLLOW` and changed through its descriptor (`fchmod`), never through a path a link could
/// redirect.
public enum StateFile {
    /// 0600: the host's user only.
    public static let mode: mode_t = 0o600

    /// A state file whose mode was changed: its path and the mode it had.
    public struct Tightened: Equatable, Sendable, CustomStringConvertible {
        public let path: String
        public let oldMode: mode_t
        public var description: String { "\(path) (was 0\(String(oldMode, radix: 8)))" }

        /// Says so on `log`, once per change: `state file mode tightened path=… was=0644`.
        public func report(to log: Log) {
            log.warn("state file mode tightened", ["path": path, "was": "0" + String(oldMode, radix: 8)])
        }
    }

    /// Sets the open file `fd` (`path` names it for the report) to `mode` when it is a regular
    /// file this process's user owns whose mode is another; returns what it changed (nil:
    /// nothing to do, or not this user's file: another user's is left as it is).
    @discardableResult
    public static func tighten(fd: Int32, path: String) -> Tightened? {
        var st = stat()
        guard fstat(fd, &st) == 0, st.st_mode & S_IFMT == S_IFREG, st.st_uid == geteuid() else { return nil }
        let old = st.st_mode & 0o7777
        guard old != mode, fchmod(fd, mode) == 0 else { return nil }
        return Tightened(path: path, oldMode: old)
    }

    /// Tightens the file at `path` (see `tighten(fd:path:)`) if there is one: opened with
    /// `O_NOFOLLOW | O_NONBLOCK` (a symlink, a FIFO or a device is left alone), read-only, then
    /// closed; a file whose mode is already `mode` is not opened. Call it before the file's
    /// owner opens it: closing any descriptor of a file drops the POSIX locks this process holds
    /// on it (SQLite's).
    @discardableResult
    public static func tighten(_ path: String) -> Tightened? {
        guard needsTightening(path) else { return nil }
        let fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        return tighten(fd: fd, path: path)
    }

    /// Whether `path` is a regular file of this user's (not a link to one) whose mode is not
    /// `mode`: `lstat` only, so a file already right is never opened.
    static func needsTightening(_ path: String) -> Bool {
        var st = stat()
        return lstat(path, &st) == 0 && st.st_mode & S_IFMT == S_IFREG && st.st_uid == geteuid() && st.st_mode & 0o7777 != mode
    }

    /// Creates `path` empty with `mode` when it does not exist, or tightens the one that does;
    /// never through a symlink (`O_NOFOLLOW`: a link there throws `ELOOP`), and only a regular
    /// file (anything else throws `EINVAL`); a file already right is not opened. Returns what it
    /// tightened. For files another library then opens by name (SQLite's database): it finds
    /// the file there with `mode`.
    @discardableResult
    public static func create(_ path: String) throws(IOError) -> Tightened? {
        var st = stat()
        if lstat(path, &st) == 0, st.st_mode & S_IFMT == S_IFREG, st.st_mode & 0o7777 == mode { return nil }
        let fd = try System.syscall("open \(path)") {
            open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, mode)
        }
        defer { close(fd) }
        _ = try System.syscall("fstat \(path)") { fstat(fd, &st) }
        guard st.st_mode & S_IFMT == S_IFREG else { throw IOError(errnoCode: EINVAL, reason: "\(path) is not a regular file") }
        return tighten(fd: fd, path: path)
    }
}
