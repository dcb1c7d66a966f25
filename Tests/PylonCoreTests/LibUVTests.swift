import CLibUV
import Testing

@testable import PylonCore

#if canImport(Glibc)
import Glibc
#endif

/// A loop of its own: suites run concurrently, and other suites use the default loop.
nonisolated(unsafe) private let loop = Loop.standalone()

/// Counts its close callbacks and reports, from its deinit, how many it had seen.
private final class Probe: UVHandleOwner {
    let handle = UVHandle<uv_timer_t>()
    var closes = 0
    let onDeinit: (_ closesSeen: Int) -> Void
    init(_ onDeinit: @escaping (Int) -> Void) {
        self.onDeinit = onDeinit
        uv_timer_init(loop.uv, handle.pointer)
        handle.retain(self)
    }
    func handleDidClose() { closes += 1 }
    deinit { onDeinit(closes) }
}

/// Reads everything available from a non-blocking descriptor.
private func drain(_ fd: Int32, into out: inout [UInt8], max: Int = 1 << 30) {
    var buf = [UInt8](repeating: 0, count: 65536)
    while out.count < max {
        let want = min(buf.count, max - out.count)
        let n = buf.withUnsafeMutableBytes { recv(fd, $0.baseAddress, want, Int32(MSG_DONTWAIT)) }
        if n <= 0 { return }
        out.append(contentsOf: buf[0..<n])
    }
}

/// A byte pattern that shows reordering, loss and duplication.
private func pattern(_ n: Int, offset: Int = 0) -> [UInt8] {
    (0..<n).map { UInt8(truncatingIfNeeded: ($0 + offset) * 7 + ($0 + offset) / 251) }
}

@Suite(.serialized) struct LibUVTests {
    // MARK: UVHandle

    @Test func handleClosesOnceAndReleasesItsOwner() {
        var deinits: [Int] = []
        weak var weakProbe: Probe?
        do {
            let p = Probe { deinits.append($0) }
            weakProbe = p
            p.handle.close()
            p.handle.close()  // ignored: uv_is_closing
            let closing = p.handle.isClosing  // (#expect cannot take a noncopyable operand)
            #expect(closing)
            #expect(p.closes == 0, "the close callback runs on a later loop iteration")
        }
        #expect(weakProbe != nil, "the handle's reference keeps the owner alive until the close callback")
        #expect(deinits.isEmpty)
        loop.run()
        #expect(weakProbe == nil)
        #expect(deinits == [1], "one deinit, after exactly one handleDidClose")
    }

    @Test func handleOwnedElsewhereOutlivesItsCloseCallback() {
        var deinits: [Int] = []
        var p: Probe? = Probe { deinits.append($0) }
        p!.handle.close()
        loop.run()
        #expect(p!.closes == 1)
        let closing = p!.handle.isClosing
        #expect(closing, "the memory stays valid while the owner lives")
        p!.handle.close()  // after the callback: still ignored
        loop.run()
        #expect(p!.closes == 1)
        p = nil
        #expect(deinits == [1])
    }

    // MARK: Loop.after

    @Test func afterFiresOnceAndClosesItsTimer() {
        var fired = 0
        let start = loop.nowMs
        var firedAt: UInt64 = 0
        let t = loop.after(ms: 20) {
            fired += 1
            firedAt = loop.nowMs
        }
        #expect(t.isActive)
        loop.run()  // returns once the one-shot timer is closed: nothing else keeps the loop alive
        #expect(fired == 1)
        #expect(firedAt >= start + 20)
        #expect(t.isClosed)
        #expect(!t.isActive)
        t.start(after: 1)  // a fired one-shot timer cannot be restarted
        loop.run()
        #expect(fired == 1)
    }

    @Test func afterCanBeCancelled() {
        var cancelledRan = false
        var otherRan = false
        let t = loop.after(ms: 10) { cancelledRan = true }
        loop.after(ms: 30) { otherRan = true }
        t.cancel()
        t.cancel()
        loop.run()
        #expect(!cancelledRan)
        #expect(otherRan)
    }

    @Test func afterCancelledFromAnEarlierTimerInTheSameTurn() {
        var ran: [Int] = []
        var second: Timer?
        loop.after(ms: 5) {
            ran.append(1)
            second?.cancel()
        }
        second = loop.after(ms: 5) { ran.append(2) }
        loop.run()
        #expect(ran == [1])
    }

    // MARK: Loop confinement

    #if DEBUG
    /// A loop-confined call from a thread other than the one running the loop traps (debug
    /// builds; the check is compiled out in release). Runs in a child process.
    @Test func offLoopUseTrapsInDebugBuilds() async {
        await #expect(processExitsWith: .failure) {
            let l = Loop.standalone()
            l.after(ms: 0) {
                var tid = uv_thread_t()
                uv_thread_create(
                    &tid,
                    { arg in
                        Unmanaged<Loop>.fromOpaque(arg!).takeUnretainedValue().preconditionInLoop()
                    }, Unmanaged.passUnretained(l).toOpaque())
                uv_thread_join(&tid)
            }
            l.run()
        }
    }

    /// The control: the same call from the loop's thread, and from any thread while the loop
    /// is not running, is fine.
    @Test func inLoopUseDoesNotTrap() async {
        await #expect(processExitsWith: .success) {
            let l = Loop.standalone()
            l.preconditionInLoop()
            l.after(ms: 0) { l.preconditionInLoop() }
            l.run()
            exit(0)
        }
    }
    #endif

    // MARK: StreamWriter

    /// More than the socket takes at once: `uv_try_write` writes part, the rest is queued with
    /// `uv_write` while a slow reader takes 16 KiB per millisecond; bytes appended meanwhile wait
    /// for the write callback. The reader must see every byte, in order.
    @Test func writerQueuesWhatTryWriteLeavesForASlowReader() throws {
        let (mine, theirs) = try System.socketPair()
        defer { System.close(theirs) }
        var small: Int32 = 16 * 1024
        setsockopt(mine, SOL_SOCKET, SO_SNDBUF, &small, socklen_t(MemoryLayout<Int32>.size))
        setsockopt(theirs, SOL_SOCKET, SO_RCVBUF, &small, socklen_t(MemoryLayout<Int32>.size))

        final class Pipe: UVHandleOwner {
            let handle = UVHandle<uv_pipe_t>()
            let writer: StreamWriter
            init(fd: Int32) {
                uv_pipe_init(loop.uv, handle.pointer, 0)
                writer = StreamWriter(stream: asStream(handle.pointer))
                handle.retain(self)
                uv_pipe_open(handle.pointer, fd)
            }
        }
        let pipe = Pipe(fd: mine)
        let w = pipe.writer
        let first = pattern(1 << 20)
        let second = pattern(300_000, offset: 1 << 20)
        var completions: [Int32] = []
        w.onWritten = { status in
            completions.append(status)
            _ = w.flush()
        }
        first.withUnsafeBytes { w.pending.append($0) }
        #expect(w.flush() == 0)
        #expect(w.isWriting, "the socket cannot take 1 MiB at once: the rest is queued")
        #expect(w.queuedBytes > 0 && w.queuedBytes < first.count, "uv_try_write took the first part")
        // Appended while a write is in flight: waits in `pending`, and flush() does not start a
        // second write.
        second.withUnsafeBytes { w.pending.append($0) }
        #expect(w.pending.count == second.count)
        #expect(w.flush() == 0)
        #expect(w.pending.count == second.count)

        var received: [UInt8] = []
        let total = first.count + second.count
        let reader = Timer(loop: loop) {}
        reader.callback = {
            drain(theirs, into: &received, max: received.count + 16 * 1024)
            if received.count >= total, !w.isWriting, w.queuedBytes == 0 { reader.close(); pipe.handle.close() }
        }
        reader.start(after: 1, repeat: 1)
        loop.run()
        #expect(received.count == total)
        #expect(received == first + second)
        #expect(!completions.isEmpty && completions.allSatisfy { $0 == 0 })
    }

    @Test func writerReportsABrokenPeer() throws {
        let (mine, theirs) = try System.socketPair()
        System.close(theirs)
        System.ignoreSIGPIPE()
        final class Pipe: UVHandleOwner {
            let handle = UVHandle<uv_pipe_t>()
            let writer: StreamWriter
            init(fd: Int32) {
                uv_pipe_init(loop.uv, handle.pointer, 0)
                writer = StreamWriter(stream: asStream(handle.pointer))
                handle.retain(self)
                uv_pipe_open(handle.pointer, fd)
            }
        }
        let pipe = Pipe(fd: mine)
        pipe.writer.pending.append("hello\n")
        let rc = pipe.writer.flush()
        #expect(rc == UV_EPIPE.rawValue)
        pipe.handle.close()
        loop.run()
    }

    /// `Connection` on the shared writer: queued lines reach a slow reader in order, then
    /// `closeAfterFlush` closes once everything is written and `onClose` runs once.
    @Test func connectionFlushesToASlowReaderThenCloses() throws {
        let (mine, theirs) = try System.socketPair()
        defer { System.close(theirs) }
        let c = try Connection(loop: loop, fd: mine, maxLineBytes: 1 << 20)
        var closes: [Int32] = []
        c.onClose = { closes.append($0) }
        var expected: [UInt8] = []
        for i in 0..<2000 {
            let line = "{\"n\":\(i),\"pad\":\"\(String(repeating: "x", count: i % 700))\"}"
            c.sendLine(line)
            expected += Array(line.utf8) + [0x0A]
        }
        loop.flushDirty()
        #expect(c.queuedBytes > 0, "more than a socket buffer: some waits for the reader")
        c.closeAfterFlush()
        var received: [UInt8] = []
        let reader = Timer(loop: loop) {}
        reader.callback = {
            drain(theirs, into: &received, max: received.count + 32 * 1024)
            if c.isClosed { drain(theirs, into: &received); reader.close() }
        }
        reader.start(after: 1, repeat: 1)
        loop.run()
        #expect(received == expected)
        #expect(closes == [0])
    }

    /// Output past `flushAboveBytes` is written inside `send`; below it, and with 0, it waits
    /// for the end of the loop turn.
    @Test func connectionWritesEarlyPastFlushAboveBytes() throws {
        let (mine, theirs) = try System.socketPair()
        defer { System.close(theirs) }
        let c = try Connection(loop: loop, fd: mine, maxLineBytes: 1 << 20)
        #expect(c.flushAboveBytes == Connection.defaultFlushAboveBytes)
        c.flushAboveBytes = 4096
        let small = String(repeating: "a", count: 100)
        let big = String(repeating: "b", count: 5000)
        c.sendLine(small)
        #expect(c.queuedBytes == 101, "under the threshold: kept for the end of the turn")
        c.sendLine(big)
        #expect(c.queuedBytes == 0, "past it: written at once, in order")
        var received: [UInt8] = []
        drain(theirs, into: &received)
        #expect(received == Array((small + "\n" + big + "\n").utf8))
        c.flushAboveBytes = 0
        c.sendLine(big)
        #expect(c.queuedBytes == 5001)
        loop.flushDirty()
        #expect(c.queuedBytes == 0)
        received.removeAll()
        drain(theirs, into: &received)
        #expect(received == Array((big + "\n").utf8))
        c.close()
        loop.run()
    }

    /// A write error met by an early write closes the connection at the end of the turn, with
    /// the error, not inside the caller's `send`.
    @Test func earlyWriteErrorClosesAtTheEndOfTheTurn() throws {
        let (mine, theirs) = try System.socketPair()
        System.close(theirs)
        System.ignoreSIGPIPE()
        let c = try Connection(loop: loop, fd: mine, maxLineBytes: 1 << 20)
        var closes: [Int32] = []
        c.onClose = { closes.append($0) }
        c.sendLine(String(repeating: "x", count: 5000))
        #expect(!c.isClosed)
        c.sendLine("more")
        #expect(!c.isClosed)
        loop.flushDirty()
        #expect(c.isClosed)
        loop.run()
        #expect(closes == [UV_EPIPE.rawValue])
    }

    // MARK: SocketPoll

    @Test func socketPollReportsReadableAndReleasesOnClose() throws {
        let (a, b) = try System.socketPair()
        defer { System.close(a); System.close(b) }
        weak var weakPoll: SocketPoll?
        var events: [Int32] = []
        do {
            let poll = SocketPoll(loop: loop, fd: a) { _, e in events.append(e) }
            weakPoll = poll
            poll.onEvent = { [unowned poll] status, e in
                #expect(status == 0)
                events.append(e)
                poll.close()
            }
            poll.watch(Int32(UV_READABLE.rawValue))
            _ = send(b, "x", 1, 0)
        }
        loop.run()
        #expect(events == [Int32(UV_READABLE.rawValue)])
        #expect(weakPoll == nil)
    }

    // MARK: System

    @Test func syscallRetriesEINTR() throws {
        var calls = 0
        let r = try System.syscall("test") { () -> Int32 in
            calls += 1
            if calls < 3 {
                errno = EINTR
                return -1
            }
            return 42
        }
        #expect(r == 42)
        #expect(calls == 3)
    }

    @Test func syscallThrowsTypedErrors() {
        var calls = 0
        #expect(throws: IOError(errnoCode: EACCES, reason: "test call")) {
            try System.syscall("test call") { () -> Int in
                calls += 1
                errno = EACCES
                return -1
            }
        }
        #expect(calls == 1, "only EINTR is retried")
    }

    @Test func fileErrorsCarryErrno() throws {
        let dir = "/tmp/pylon-libuv-tests-\(System.pid)"
        defer { _ = unlink(dir + "/f"); _ = unlink(dir + "/big"); _ = rmdir(dir + "/sub/deeper"); _ = rmdir(dir + "/sub"); _ = rmdir(dir) }

        do throws(IOError) {
            _ = try System.readFile(atPath: dir + "/missing")
            Issue.record("read a missing file")
        } catch {
            #expect(error.errnoCode == ENOENT)
            #expect(error.reason.contains("/missing"))
        }
        #expect(System.readFile(dir + "/missing") == nil, "the old spelling still answers nil")

        try System.createDirectories(atPath: dir + "/sub/deeper", mode: 0o700)
        try System.createDirectories(atPath: dir + "/sub/deeper")  // existing: fine
        try System.writeFileAtomically(atPath: dir + "/f", contents: Array("abc".utf8))
        #expect(try System.readFile(atPath: dir + "/f") == Array("abc".utf8))
        #expect(access(dir + "/f.tmp", F_OK) != 0, "the temporary file was renamed away")

        do throws(IOError) {
            try System.createDirectories(atPath: dir + "/f/x")
            Issue.record("created a directory under a file")
        } catch {
            #expect(error.errnoCode == ENOTDIR)
        }
        do throws(IOError) {
            try System.createDirectories(atPath: dir + "/f")
            Issue.record("an existing file passed as a directory")
        } catch {
            #expect(error.errnoCode == ENOTDIR)
        }
        do throws(IOError) {
            try System.writeFileAtomically(atPath: dir + "/nodir/f", contents: [1])
            Issue.record("wrote into a missing directory")
        } catch {
            #expect(error.errnoCode == ENOENT)
        }

        // A symlink planted at `<path>.tmp` (the metrics textfile's directory may be writable by
        // others) is replaced, never written through: its target is unchanged.
        try System.writeFileAtomically(atPath: dir + "/victim", contents: Array("keep".utf8))
        #expect(symlink(dir + "/victim", dir + "/m.prom.tmp") == 0)
        try System.writeFileAtomically(atPath: dir + "/m.prom", contents: Array("metrics".utf8), mode: 0o640)
        #expect(try System.readFile(atPath: dir + "/victim") == Array("keep".utf8))
        #expect(try System.readFile(atPath: dir + "/m.prom") == Array("metrics".utf8))
        var st = stat()
        #expect(stat(dir + "/m.prom", &st) == 0 && st.st_mode & 0o777 == 0o640, "the mode asked for, not the umask's")

        let big = pattern(200_000)
        try System.writeFileAtomically(atPath: dir + "/big", contents: big)
        #expect(try System.readFile(atPath: dir + "/big", maxBytes: 200_000) == big)
        do throws(IOError) {
            _ = try System.readFile(atPath: dir + "/big", maxBytes: 199_999)
            Issue.record("read past maxBytes")
        } catch {
            #expect(error.errnoCode == EFBIG)
        }
        // The old spelling's contract: past `limit` it returns what it read, at least limit + 1.
        let prefix = try #require(System.readFile(dir + "/big", limit: 1000))
        #expect(prefix.count > 1000 && Array(big.prefix(prefix.count)) == prefix)
    }

    @Test func connectErrorsMapToUVErrors() {
        let path = "/tmp/pylon-libuv-tests-nosuch-\(System.pid).sock"
        do throws(IOError) {
            _ = try System.connectUnixSocket(path)
            Issue.record("connected to nothing")
        } catch {
            #expect(error.errnoCode == ENOENT)
        }
        do throws(UVError) {
            _ = try System.connectUnix(path)
            Issue.record("connected to nothing")
        } catch {
            #expect(error.code == UV_ENOENT.rawValue)
            #expect(error.context == "connect \(path)")
        }
    }
}
