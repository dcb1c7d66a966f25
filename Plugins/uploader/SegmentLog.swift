import PylonCore
import PylonStore

#if canImport(Glibc)
import Glibc
#endif

/// The segment files of the queue: `<dir>/<number>.seg`, numbered upwards from 1 (ten decimal
/// digits), mode 0600 in a directory of mode 0700. Records and the batch ledger are appended to
/// the newest (the active one); a full one is closed and the next one started; the oldest is
/// removed once nothing in it is live (`UploaderStore.reclaim`). Loop thread only.
///
/// A segment file that cannot be read as one (a symlink, a directory or anything not a regular
/// file, a file this user cannot open or read, one without the segment magic) is quarantined
/// at open: renamed `<number>.seg.quarantined` beside it, never followed or opened through a
/// link, and the queue goes on without it (docs/UPLOADER.md "Quarantine").
final class SegmentLog {
    let dir: String
    /// An active segment holding at least this many bytes is closed before the next append.
    let maxSegmentBytes: Int
    let fsyncEveryAppend: Bool
    /// Segment number → its size on disk.
    private(set) var sizes: [UInt32: Int] = [:]
    private(set) var active: UInt32 = 0
    private var fds: [UInt32: Int32] = [:]
    /// Tests: the next append fails with this error before writing anything.
    var failNextAppend: IOError?

    /// A segment file set aside: its name in the queue directory now, and why.
    struct Quarantined: Equatable {
        var file: String
        var reason: String
    }

    /// What a quarantined file's name gets: `0000000900.seg.quarantined` (then `.2`, `.3`, …
    /// when that name is taken). The queue's `lock`, when it is not a regular file, is set
    /// aside the same way (`lock.quarantined`) and made anew.
    static let quarantineSuffix = ".quarantined"
    /// At most this many files of one segment's name are kept aside; one more is refused (the
    /// queue does not open until an operator clears them).
    static let maxQuarantinedPerName = 100
    /// The files this open set aside (each logged once, by the uploader).
    private(set) var quarantinedNow: [Quarantined] = []
    /// The names of every file set aside in the queue directory (this open's and earlier
    /// ones' until an operator removes them), sorted.
    private(set) var quarantinedFiles: [String] = []
    /// Segment files this open tightened to `StateFile.mode` (each logged once, by the uploader).
    private(set) var tightened: [StateFile.Tightened] = []

    /// Bytes of every segment file.
    var fileBytes: Int { sizes.values.reduce(0, +) }
    var numbers: [UInt32] { sizes.keys.sorted() }

    /// The largest segment file: the index keeps offsets in a segment as `UInt32`
    /// (`QueueIndex.Rec`). A segment is closed past `maxSegmentBytes` (at most 4 MiB) long
    /// before; a larger file found at open is quarantined, and an append that would pass it
    /// fails (nothing written).
    static let maxSegmentFileBytes = Int(UInt32.max)

    /// How long an open waits for the queue's lock: an uploader whose host was killed may still
    /// be running for a moment while its successor starts.
    static let lockWaitMs = 10_000
    /// `<dir>/lock`, held (`flock`, exclusive) while this log is open: one process at a time
    /// appends, replays and removes segments.
    private var lockFD: Int32

    init(dir: String, maxSegmentBytes: Int, fsyncEveryAppend: Bool, lockWaitMs: Int = SegmentLog.lockWaitMs) throws {
        self.dir = dir
        self.maxSegmentBytes = maxSegmentBytes
        self.fsyncEveryAppend = fsyncEveryAppend
        try System.createDirectories(atPath: dir, mode: 0o700)
        // One made looser by hand is tightened; one this user cannot tighten is not opened.
        _ = try System.syscall("chmod \(dir)") { chmod(dir, 0o700) }
        let lock = dir + "/lock"
        // A lock that is not a regular file (a planted symlink or directory) is set aside too:
        // no process could have locked it, since each opens it with O_NOFOLLOW.
        var lockAside: Quarantined?
        var f = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, StateFile.mode)
        var unusable: String?
        var st = stat()
        if f < 0, errno == ELOOP || errno == EISDIR || errno == ENXIO {
            unusable = errno == EISDIR ? "a directory" : errno == ELOOP ? "a symbolic link" : "not a regular file"
        } else if f >= 0, fstat(f, &st) == 0, st.st_mode & S_IFMT != S_IFREG {
            Glibc.close(f)
            unusable = "not a regular file"
        }
        if let reason = unusable {
            lockAside = Quarantined(file: try SegmentLog.setAside(lock, in: dir, reason: reason), reason: reason)
            f = open(lock, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, StateFile.mode)
        }
        guard f >= 0 else { throw IOError(errnoCode: errno, reason: "open \(lock)") }
        lockFD = f
        quarantinedNow += lockAside.map { [$0] } ?? []
        if let t = StateFile.tighten(fd: lockFD, path: lock) { tightened.append(t) }
        var waited = 0
        while flock(lockFD, LOCK_EX | LOCK_NB) != 0 {
            let e = errno
            guard e == EWOULDBLOCK || e == EINTR, waited < lockWaitMs else {
                Glibc.close(lockFD)
                throw IOError(errnoCode: e, reason: "lock \(lock): another process holds the queue")
            }
            var ts = timespec(tv_sec: 0, tv_nsec: 20_000_000)
            _ = nanosleep(&ts, nil)
            waited += 20
        }
        for n in try SegmentLog.list(dir) {
            if let reason = try openExisting(n) { try quarantine(n, reason: reason) }
        }
        quarantinedFiles = try SegmentLog.listQuarantined(dir)
        active = sizes.keys.max() ?? 0
    }

    /// Checks that existing segment `n` opens for reading and appending, never through a
    /// symlink, and tightens its mode; returns why it cannot be used (nil: it can). A shortage
    /// of descriptors or memory throws: it says nothing about the file.
    private func openExisting(_ n: UInt32) throws -> String? {
        let p = path(n)
        var st = stat()
        guard lstat(p, &st) == 0 else { return "lstat: " + String(cString: strerror(errno)) }
        guard st.st_mode & S_IFMT == S_IFREG else { return SegmentLog.kind(st.st_mode) }
        let f = open(p, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)
        guard f >= 0 else {
            let e = errno
            if SegmentLog.transientErrnos.contains(e) { throw IOError(errnoCode: e, reason: "open \(p)") }
            return "open: " + String(cString: strerror(e))
        }
        defer { Glibc.close(f) }
        guard fstat(f, &st) == 0, st.st_mode & S_IFMT == S_IFREG else { return SegmentLog.kind(st.st_mode) }
        guard Int(st.st_size) <= SegmentLog.maxSegmentFileBytes else { return "larger than \(SegmentLog.maxSegmentFileBytes) bytes" }
        if let t = StateFile.tighten(fd: f, path: p) { tightened.append(t) }
        sizes[n] = Int(st.st_size)
        return nil
    }

    /// Failures of the process, not of a file: never a reason to set a segment aside.
    static let transientErrnos: Set<Int32> = [EMFILE, ENFILE, ENOMEM, EINTR, EAGAIN]

    /// Whether `error` is one of `transientErrnos`.
    static func isTransient(_ error: any Error) -> Bool {
        (error as? IOError).map { transientErrnos.contains($0.errnoCode) } ?? false
    }

    /// What a file that is not a regular one is, for the quarantine's reason.
    private static func kind(_ mode: mode_t) -> String {
        switch mode & S_IFMT {
        case S_IFLNK: return "a symbolic link"
        case S_IFDIR: return "a directory"
        default: return "not a regular file"
        }
    }

    /// Sets segment `n` aside (`<name>.quarantined`): closed, forgotten, renamed (the name
    /// itself: a symlink is moved, never followed), the directory fsynced. The queue goes on
    /// without it; what it held is lost to the queue.
    func quarantine(_ n: UInt32, reason: String) throws {
        if let f = fds.removeValue(forKey: n) { Glibc.close(f) }
        sizes[n] = nil
        let name = try SegmentLog.setAside(path(n), in: dir, reason: reason)
        quarantinedNow.append(Quarantined(file: name, reason: reason))
        quarantinedFiles = (quarantinedFiles + [name]).sorted()
        if active == n { active = sizes.keys.max() ?? 0 }
    }

    /// Renames `from` (a name in `dir`) to `<name>.quarantined` (`.2`, … when taken) and
    /// fsyncs `dir`; returns the new name.
    private static func setAside(_ from: String, in dir: String, reason: String) throws -> String {
        let base = from + quarantineSuffix
        var to = base
        var st = stat()
        var k = 1
        while lstat(to, &st) == 0 {
            k += 1
            guard k <= maxQuarantinedPerName else {
                throw QueueError(message: "\(from): cannot be read (\(reason)) and \(k - 1) files of its name are quarantined already")
            }
            to = base + ".\(k)"
        }
        _ = try System.syscall("rename \(from)") { rename(from, to) }
        try syncDirectory(dir)
        return String(to.dropFirst(dir.count + 1))
    }

    /// Names of the files set aside in `dir` (`*.quarantined`, `*.quarantined.N`).
    static func listQuarantined(_ dir: String) throws -> [String] {
        guard let d = opendir(dir) else { throw IOError(errnoCode: errno, reason: "opendir \(dir)") }
        defer { closedir(d) }
        var out: [String] = []
        while let e = readdir(d) {
            let name = withUnsafeBytes(of: e.pointee.d_name) { String(cString: $0.bindMemory(to: CChar.self).baseAddress!) }
            if name.hasSuffix(quarantineSuffix) || name.contains(quarantineSuffix + ".") { out.append(name) }
        }
        return out.sorted()
    }

    func path(_ n: UInt32) -> String {
        let digits = String(n)
        return dir + "/" + String(repeating: "0", count: max(0, 10 - digits.count)) + digits + ".seg"
    }

    static func list(_ dir: String) throws -> [UInt32] {
        guard let d = opendir(dir) else { throw IOError(errnoCode: errno, reason: "opendir \(dir)") }
        defer { closedir(d) }
        var out: [UInt32] = []
        while let e = readdir(d) {
            let name = withUnsafeBytes(of: e.pointee.d_name) { String(cString: $0.bindMemory(to: CChar.self).baseAddress!) }
            guard name.hasSuffix(".seg"), name.count == 14, let n = UInt32(name.dropLast(4)), n > 0 else { continue }
            out.append(n)
        }
        return out.sorted()
    }

    /// The whole file of segment `n` as its size was at open (at start-up, and for a
    /// compaction), never through a symlink.
    func read(_ n: UInt32) throws -> [UInt8] {
        if fds[n] != nil { return try read(n, 0..<(sizes[n] ?? 0)) }
        // Not kept open: the replay reads every segment once, most are never written again.
        let f = try System.syscall("open \(path(n))") { open(path(n), O_RDONLY | O_CLOEXEC | O_NOFOLLOW) }
        defer { Glibc.close(f) }
        return try read(f, n, 0..<(sizes[n] ?? 0))
    }

    private func fd(_ n: UInt32) throws -> Int32 {
        if let f = fds[n] { return f }
        let f = try System.syscall("open \(path(n))") { open(path(n), O_RDWR | O_CLOEXEC | O_NOFOLLOW) }
        fds[n] = f
        return f
    }

    /// Cuts segment `n` back to `size` bytes (a torn tail found at start-up, or a failed append).
    func truncate(_ n: UInt32, to size: Int) throws {
        let f = try fd(n)
        _ = try System.syscall("ftruncate \(path(n))") { ftruncate(f, off_t(size)) }
        sizes[n] = size
    }

    /// Whether the next append of `bytes` starts a new segment.
    func needsNewSegment(for bytes: Int) -> Bool {
        guard active != 0, let size = sizes[active] else { return true }
        return size > Frame.segmentMagic.count && size + bytes > maxSegmentBytes
    }

    /// Closes the active segment (fdatasync: it is never written again) and starts the next
    /// (created 0600, never through a link: whatever the umask, `open` can only narrow the
    /// mode). A segment whose magic could not be written and synced is removed again, so the
    /// next try creates it anew; one whose name could not be synced in the directory is used,
    /// and the next append syncs the directory first (`directoryUnsynced`).
    func startSegment() throws {
        if active != 0, let f = fds[active] { _ = try System.syscall("fdatasync") { fdatasync(f) } }
        let n = active + 1
        let f = try System.syscall("create \(path(n))") { open(path(n), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600) }
        do {
            try writeAll(f, Frame.segmentMagic, at: 0, n)
            _ = try System.syscall("fdatasync \(path(n))") { fdatasync(f) }
        } catch {
            Glibc.close(f)
            // Best effort: when the unlink fails too, the next open finds a segment without
            // its magic, empty or zeros, and makes it an empty one.
            _ = unlink(path(n))
            throw error
        }
        fds[n] = f
        sizes[n] = Frame.segmentMagic.count
        active = n
        try syncDirectory()
    }

    /// Appends `bytes` to the active segment with one write (and one fdatasync with `fsync:
    /// full`, or when `sync`); returns the offset they start at. A failed append leaves the
    /// segment as it was.
    @discardableResult
    func append(_ bytes: [UInt8], sync: Bool = false) throws -> Int {
        if let e = failNextAppend {
            failNextAppend = nil
            throw e
        }
        if active == 0 { try startSegment() }
        if directoryUnsynced { try syncDirectory() }
        let n = active
        let f = try fd(n)
        let at = sizes[n]!
        guard bytes.count <= SegmentLog.maxSegmentFileBytes - at else {
            throw QueueError(message: "segment \(n): \(bytes.count) bytes more would pass \(SegmentLog.maxSegmentFileBytes) bytes")
        }
        do {
            try writeAll(f, bytes, at: at, n)
            if fsyncEveryAppend || sync { _ = try System.syscall("fdatasync \(path(n))") { fdatasync(f) } }
        } catch {
            undo(f, n, from: at, count: bytes.count)
            throw error
        }
        sizes[n] = at + bytes.count
        return at
    }

    /// Undoes a failed append of `count` bytes at `at`: the segment is cut back there. When it
    /// cannot be, what the write left is overwritten with zeros (no new blocks needed), so no
    /// frame of it replays (a head of zeros ends a segment's valid part) and the next append
    /// writes at `at` again. When that fails too there is nothing left to do: the frames it
    /// left may replay after a restart, as if the append had succeeded.
    private func undo(_ f: Int32, _ n: UInt32, from at: Int, count: Int) {
        if ftruncate(f, off_t(at)) == 0 { return }
        var st = stat()
        let end = fstat(f, &st) == 0 ? Int(st.st_size) : at + count
        guard end > at else { return }
        try? writeAll(f, [UInt8](repeating: 0, count: min(count, end - at)), at: at, n)
    }

    private func writeAll(_ f: Int32, _ bytes: [UInt8], at: Int, _ n: UInt32) throws {
        var off = 0
        while off < bytes.count {
            let w = try System.syscall("write \(path(n))") {
                bytes.withUnsafeBytes { pwrite(f, $0.baseAddress! + off, bytes.count - off, off_t(at + off)) }
            }
            off += w
        }
    }

    /// Bytes `range` of segment `n`.
    func read(_ n: UInt32, _ range: Range<Int>) throws -> [UInt8] { try read(try fd(n), n, range) }

    private func read(_ f: Int32, _ n: UInt32, _ range: Range<Int>) throws -> [UInt8] {
        var out = [UInt8](repeating: 0, count: range.count)
        var off = 0
        while off < range.count {
            let r = try System.syscall("read \(path(n))") {
                out.withUnsafeMutableBytes { pread(f, $0.baseAddress! + off, range.count - off, off_t(range.lowerBound + off)) }
            }
            if r == 0 { throw IOError(errnoCode: EIO, reason: "read \(path(n)): short segment") }
            off += r
        }
        return out
    }

    /// Overwrites `bytes` at `offset` of segment `n` (a purge rewriting a frame).
    func overwrite(_ n: UInt32, at offset: Int, _ bytes: [UInt8]) throws { try writeAll(try fd(n), bytes, at: offset, n) }

    func sync(_ n: UInt32) throws {
        let f = try fd(n)
        _ = try System.syscall("fdatasync \(path(n))") { fdatasync(f) }
    }

    /// Removes segment `n` (never the active one).
    func remove(_ n: UInt32) throws {
        if let f = fds.removeValue(forKey: n) { Glibc.close(f) }
        _ = try System.syscall("unlink \(path(n))") { unlink(path(n)) }
        sizes[n] = nil
        try syncDirectory()
    }

    /// A segment was created or removed and the directory's fsync failed: the next append
    /// syncs it first, so nothing is acknowledged in a segment whose name may not survive a
    /// power cut.
    private var directoryUnsynced = false

    /// fsync of the queue directory: the names of segments created, removed or set aside are
    /// durable.
    func syncDirectory() throws {
        directoryUnsynced = true
        try SegmentLog.syncDirectory(dir)
        directoryUnsynced = false
    }

    static func syncDirectory(_ dir: String) throws {
        let d = try System.syscall("open \(dir)") { open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) }
        defer { Glibc.close(d) }
        _ = try System.syscall("fsync \(dir)") { fsync(d) }
    }

    /// Closes the files and releases the lock.
    func close() {
        for f in fds.values { Glibc.close(f) }
        fds.removeAll()
        if lockFD >= 0 { Glibc.close(lockFD) }
        lockFD = -1
    }
}
