import CLibUV

#if canImport(Glibc)
import Glibc
#endif

/// Shared read buffer: reads are processed synchronously on the loop thread, so one suffices.
nonisolated(unsafe) private let readBuffer = UnsafeMutablePointer<CChar>.allocate(capacity: readBufferSize)
private let readBufferSize = 256 * 1024

/// A framed, newline-delimited stream over a `uv_pipe_t` (Unix socket, socketpair end or pipe).
///
/// Reading: every read is split into lines by a `LineFramer`; each line goes to `onLine`. After a
/// read has been fully dispatched, the loop writes out all connections that gained output, so a
/// burst of requests costs one write per peer rather than one per message. A connection that has
/// gathered `flushAboveBytes` of output mid-turn writes it then (one `uv_try_write`), so a long
/// burst travels on in pieces that the next process starts on while this one reads the rest,
/// instead of as one convoy at the end of the turn.
///
/// Writing: `send` appends to an in-memory queue (`StreamWriter`). `queuedBytes` is what the peer
/// has not yet taken; past `pauseAbove` the connection stops reading (backpressure) until it
/// drains to half.
///
/// Lifetime: the pipe is a `UVHandle` whose reference keeps the connection alive until libuv's
/// close callback (`onClose` runs there). Loop-confined: every entry point belongs on the
/// loop's thread (checked in debug builds).
///
/// Dispatch gate: input is handed to `onLine` only while the connection is not backpressured and
/// not held (`hold(until:)`: another connection it feeds is congested). The gate is checked after
/// every line, so one read of many requests stops mid-way: the rest of that read is kept
/// (`backlog`, at most one read buffer) and dispatched on a later loop turn once the gate opens.
/// That is what bounds the output a peer can cause without reading, and the work one peer gets
/// per loop turn.
public final class Connection: UVHandleOwner {
    public let loop: Loop
    let handle: UVHandle<uv_pipe_t>
    private var framer: LineFramer
    private let writer: StreamWriter
    /// `writer.pending`, held directly: the send path appends to it with one load.
    private let pending: ByteBuffer
    private var isDirty = false
    /// The life phase and the input gate as one explicit state (`ConnectionGate`): input wanted,
    /// libuv reading, backpressure, holds, the backlog's scheduling, half-close, close after
    /// flush, closed. This class performs its effects.
    private var gate = ConnectionGate()
    /// The connections waiting for this one to drain (each holds it once).
    private var drainWaiters: [Connection] = []
    /// Input read but not yet dispatched because the gate closed mid-read.
    private var backlog: [UInt8] = []
    public var isClosed: Bool { gate.isClosed }

    /// The default of `flushAboveBytes`: 4 KiB. Measured with the anchors harness (64 requests of
    /// ~200 bytes in flight through the host and the echo plugin): 1.4-1.8x the round trips of
    /// writing only at the end of the turn; 1 KiB costs more in writes than it gains with four
    /// clients, and 16 KiB never triggers for such a window.
    public static let defaultFlushAboveBytes = 4096

    /// Output queued during a loop turn is written as soon as this many bytes wait, not only at
    /// the end of the turn (0 = only at the end of the turn).
    public var flushAboveBytes = Connection.defaultFlushAboveBytes
    /// A write error met by an early write (inside a `send`): reported, and the connection
    /// closed, at the end of the turn, never inside the caller's `send`.
    private var earlyWriteError: Int32 = 0

    /// Pause reading while more than this many bytes wait to be written to the peer (0 = never).
    /// Past it the connection also counts as congested (`isCongested`).
    public var pauseAbove: Int = 0
    /// False for a peer whose input is what drains its output (a plugin answering the requests
    /// queued to it): its reading never pauses for its own congestion; those who fill its queue
    /// are held instead (`hold(until:)`).
    public var pausesReadingWhenCongested = true

    public var onLine: (UnsafeRawBufferPointer) -> Void = { _ in }
    public var onOversized: (Int, [UInt8]) -> Void = { _, _ in }
    public var onClose: (_ error: Int32) -> Void = { _ in }
    /// When set, end of input does not close the connection (so replies can still be written);
    /// the owner decides when to close. When nil, EOF closes at once.
    public var onEOF: (() -> Void)?
    /// True after the peer shut down its sending side.
    public var peerShutdown: Bool { gate.peerShutdown }

    public var maxLineBytes: Int {
        get { framer.maxLineBytes }
        set { framer.maxLineBytes = newValue }
    }

    /// Bytes accepted by `send` that the peer has not read yet.
    public var queuedBytes: Int { writer.queuedBytes }

    /// An unopened pipe handle (for `uv_spawn` stdio or `uv_accept`).
    public init(loop: Loop, maxLineBytes: Int) {
        self.loop = loop
        framer = LineFramer(maxLineBytes: maxLineBytes)
        let h = UVHandle<uv_pipe_t>()
        uv_pipe_init(loop.uv, h.pointer, 0)
        writer = StreamWriter(stream: asStream(h.pointer))
        pending = writer.pending
        handle = h
        handle.retain(self)
        writer.onWritten = { [unowned self] status in self.didWrite(status) }
    }

    /// Wraps an already-connected descriptor (`uv_pipe_open`).
    public convenience init(loop: Loop, fd: Int32, maxLineBytes: Int) throws(UVError) {
        self.init(loop: loop, maxLineBytes: maxLineBytes)
        let rc = uv_pipe_open(handle.pointer, fd)
        if rc < 0 {
            close()
            throw UVError(rc, "uv_pipe_open(\(fd))")
        }
    }

    /// Connects to a Unix socket path synchronously (blocking `connect(2)`), then wraps it.
    public static func connect(loop: Loop, path: String, maxLineBytes: Int) throws(UVError) -> Connection {
        let fd = try System.connectUnix(path)
        return try Connection(loop: loop, fd: fd, maxLineBytes: maxLineBytes)
    }

    public var stream: UnsafeMutablePointer<uv_stream_t> { asStream(handle.pointer) }

    /// The OS descriptor (`uv_fileno`), or -1.
    public var fd: Int32 {
        if isClosed { return -1 }
        var f = uv_os_fd_t(-1)
        return uv_fileno(handle.base, &f) == 0 ? Int32(f) : -1
    }

    public func startReading() {
        loop.preconditionInLoop()
        guard gate.startReading() else { return }
        syncReading()
    }

    public func stopReading() {
        loop.preconditionInLoop()
        gate.stopReading()
        syncReading()
    }

    /// True while input may be dispatched.
    private var canDispatch: Bool { gate.canDispatch }

    /// Work units (one per line, more for what the owner `charge`s) dispatched from one read
    /// (or one backlog turn) before the rest waits for the next loop turn: one peer's burst
    /// cannot keep the loop from everyone else for long. A pipelined client with 64 requests in
    /// flight never reaches it.
    public static let maxWorkPerTurn = 256
    private var turnBudget = 0

    /// Called from `onLine`: this line cost `units` more than an ordinary one (an expensive host
    /// method), so fewer of the peer's lines follow in this turn.
    public func charge(_ units: Int) { turnBudget -= units }

    /// Called from `onLine` by an owner that works through one line in parts (a JSON-RPC batch,
    /// whose members cost what they would cost as lines of their own): whether this turn may
    /// take another part — budget left after the line's own unit, and the gate still open (not
    /// backpressured, not held). When false, the owner keeps its place and `deferCurrentLine`s:
    /// the line comes again, first, on a later turn.
    public var mayContinueLine: Bool { turnBudget > 1 && canDispatch }

    /// Makes libuv's reading match the gate, and schedules the backlog when it can go on.
    private func syncReading() {
        let effects = gate.sync(hasBacklog: !backlog.isEmpty)
        if effects.startRead {
            uv_read_start(
                stream,
                { h, _, buf in
                    buf!.pointee = pylon_buf(readBuffer, readBufferSize)
                },
                { s, nread, _ in
                    let c = Unmanaged<Connection>.fromOpaque(s!.pointee.data).takeUnretainedValue()
                    c.didRead(nread)
                })
        } else if effects.stopRead {
            uv_read_stop(stream)
        }
        if effects.scheduleBacklog {
            // On the next loop turn, after others' I/O (this may run inside another
            // connection's dispatch, too).
            loop.nextTurn { [weak self] in
                guard let self else { return }
                self.gate.backlogRan()
                self.dispatchBacklog()
            }
        }
    }

    /// Hands lines of `bytes` to the owner while the gate is open; returns the bytes consumed.
    /// A line the owner deferred (`deferCurrentLine`) is kept in `deferred`, to go first.
    private func dispatch(_ bytes: UnsafeRawBufferPointer) -> Int {
        turnBudget = Connection.maxWorkPerTurn
        let used = framer.feed(
            bytes,
            until: { event in
                guard !self.isClosed else { return false }
                switch event {
                case .line(let l):
                    self.onLine(l)
                    if self.deferRequested {
                        self.deferRequested = false
                        self.deferred = Array(l) + [0x0A]
                        return false
                    }
                case .oversized(let n, let head): self.onOversized(n, head)
                }
                self.turnBudget -= 1
                return self.turnBudget > 0 && self.canDispatch
            })
        if turnBudget <= 0 { budgetPauses &+= 1 }
        return used
    }

    private var deferRequested = false
    private var deferred: [UInt8] = []

    /// Called from `onLine`: the line was not taken (its target is congested and this connection
    /// was held): it is dispatched again, first, when the gate reopens.
    public func deferCurrentLine() { deferRequested = true }

    /// Keeps what was not dispatched: a deferred line, then the unread rest of the input.
    private func keepBacklog(_ rest: UnsafeRawBufferPointer) {
        var kept = deferred
        deferred = []
        kept.append(contentsOf: rest)
        backlog = kept + backlog
    }

    /// How often a read had more work than `maxWorkPerTurn` (the rest went to a later turn).
    public private(set) var budgetPauses: UInt64 = 0

    private func didRead(_ nread: Int) {
        if nread < 0 {
            if nread == Int(UV_EOF.rawValue), let onEOF {
                // Half-close: the peer sent everything it will send but may still read.
                gate.peerShutDown()
                syncReading()
                onEOF()
            } else {
                close(error: nread == Int(UV_EOF.rawValue) ? 0 : Int32(nread))
            }
            return
        }
        guard nread > 0 else { return }
        let chunk = UnsafeRawBufferPointer(start: readBuffer, count: nread)
        let used = dispatch(chunk)
        if used < nread || !deferred.isEmpty, !isClosed, gate.wantsReading {
            keepBacklog(UnsafeRawBufferPointer(rebasing: chunk[used...]))
            syncReading()
        }
        loop.flushDirty()
    }

    private func dispatchBacklog() {
        guard canDispatch, !backlog.isEmpty else { return }
        let data = backlog
        backlog = []
        let used = data.withUnsafeBytes { dispatch($0) }
        if used < data.count || !deferred.isEmpty, !isClosed, gate.wantsReading {
            data.withUnsafeBytes { keepBacklog(UnsafeRawBufferPointer(rebasing: $0[used...])) }
        }
        syncReading()
        loop.flushDirty()
    }

    /// Bytes read from the peer and not yet dispatched.
    public var backlogBytes: Int { backlog.count }

    /// More is queued for the peer than `pauseAbove`.
    public var isCongested: Bool { pauseAbove > 0 && queuedBytes > pauseAbove }

    /// Stops dispatching this connection's input until `other` has drained to half its
    /// `pauseAbove` (or closed): backpressure from a congested peer to whoever fills it.
    public func hold(until other: Connection) {
        guard !isClosed, !other.isClosed, other.isCongested, !other.drainWaiters.contains(where: { $0 === self }) else { return }
        gate.hold()
        other.drainWaiters.append(self)
        syncReading()
    }

    /// True while held by a congested peer.
    public var isHeld: Bool { gate.isHeld }

    private func releaseWaiters() {
        let waiters = drainWaiters
        drainWaiters = []
        for w in waiters {
            w.gate.release()
            w.syncReading()
        }
    }

    // MARK: Writing

    /// Queues one line (a `\n` is appended).
    public func sendLine(_ bytes: UnsafeRawBufferPointer) {
        loop.preconditionInLoop()
        guard !isClosed else { return }
        pending.append(bytes)
        pending.append(byte: 0x0A)
        markDirty()
    }
    public func send(_ ref: JSONRef) { ref.withSerialized { sendLine($0) } }

    /// Queues `line` with the bytes in `span` replaced by `replacement` (the id rewrite).
    public func sendSpliced(_ line: UnsafeRawBufferPointer, _ span: Range<Int>, _ replacement: UnsafeRawBufferPointer) {
        loop.preconditionInLoop()
        guard !isClosed else { return }
        appendSpliced(line, span, replacement, UnsafeRawBufferPointer(start: nil, count: 0))
        markDirty()
    }

    /// Appends `line` with `span` replaced by `a` then `b`, and a newline, in one write into the
    /// queue.
    private func appendSpliced(_ line: UnsafeRawBufferPointer, _ span: Range<Int>, _ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer)
    {
        let n = line.count - span.count + a.count + b.count + 1
        pending.append(upTo: n) { out in
            var at = 0
            @inline(__always) func put(_ piece: UnsafeRawBufferPointer) {
                guard let p = piece.baseAddress, piece.count > 0 else { return }
                (out + at).copyMemory(from: p, byteCount: piece.count)
                at += piece.count
            }
            put(UnsafeRawBufferPointer(rebasing: line[..<span.lowerBound]))
            put(a)
            put(b)
            put(UnsafeRawBufferPointer(rebasing: line[span.upperBound...]))
            out.storeBytes(of: 0x0A, toByteOffset: at, as: UInt8.self)
            return at + 1
        }
    }

    /// `sendSpliced` with a decimal integer, followed by the bytes of `suffix`, as the
    /// replacement.
    public func sendSpliced(
        _ line: UnsafeRawBufferPointer, _ span: Range<Int>, int value: Int64,
        then suffix: UnsafeRawBufferPointer = .init(start: nil, count: 0)
    ) {
        loop.preconditionInLoop()
        guard !isClosed else { return }
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 24) { buf in
            var v = value.magnitude
            var i = 24
            repeat {
                i -= 1
                buf[i] = UInt8(truncatingIfNeeded: v % 10) + 0x30
                v /= 10
            } while v > 0
            if value < 0 { i -= 1; buf[i] = UInt8(ascii: "-") }
            appendSpliced(line, span, UnsafeRawBufferPointer(rebasing: UnsafeMutableRawBufferPointer(buf)[i...]), suffix)
        }
        markDirty()
    }
    public func send(_ json: JSON) { send(JSONRef(json)) }
    public func sendLine(_ s: String) {
        var s = s
        s.withUTF8 { sendLine(UnsafeRawBufferPointer($0)) }
    }

    private func markDirty() {
        if !isDirty {
            isDirty = true
            loop.markDirty(self)
        }
        if flushAboveBytes > 0, pending.count >= flushAboveBytes, !writer.isWriting, earlyWriteError == 0 {
            // Stays marked dirty: the end of the turn writes the rest and does the bookkeeping
            // (`flushNow`), including closing on an error met here.
            earlyWriteError = writer.flush()
        }
        if pauseAbove > 0, pausesReadingWhenCongested, !gate.backpressured, queuedBytes > pauseAbove {
            gate.setBackpressured(true)
            syncReading()
        }
    }

    /// Writes queued bytes now (`StreamWriter.flush`: `uv_try_write`, the rest with one
    /// `uv_write`).
    func flushNow() {
        isDirty = false
        guard !isClosed else { return }
        if earlyWriteError < 0 {
            close(error: earlyWriteError)
            return
        }
        guard !writer.isWriting else { return }
        let rc = writer.flush()
        if rc < 0 {
            close(error: rc)
            return
        }
        if !writer.isWriting { afterDrain() }
    }

    private func didWrite(_ status: Int32) {
        if status < 0 {
            close(error: status)
            return
        }
        flushNow()
    }

    private func afterDrain() {
        if gate.backpressured, queuedBytes <= pauseAbove / 2 {
            gate.setBackpressured(false)
            syncReading()
        }
        if !drainWaiters.isEmpty, queuedBytes <= pauseAbove / 2 { releaseWaiters() }
        if gate.closeWhenFlushed, queuedBytes == 0 { close() }
    }

    /// True while reading is paused because the peer is not taking its output.
    public var isBackpressured: Bool { gate.backpressured }

    /// Refuses a just-accepted connection: writes `line` (and a newline) if the socket takes it
    /// at once, never queueing, then closes. The descriptor is released immediately.
    public func refuse(line: String) {
        var bytes = Array(line.utf8)
        bytes.append(0x0A)
        _ = bytes.withUnsafeBytes { writer.writeNowOrDrop($0) }
        close()
    }

    /// Closes once everything queued has been written.
    public func closeAfterFlush() {
        loop.preconditionInLoop()
        gate.closeAfterFlush()
        syncReading()
        if queuedBytes == 0 { close() } else { markDirty() }
    }

    /// Closes the handle; `onClose` runs from libuv's close callback, after which the object is
    /// released by its handle. Safe to call more than once.
    public func close(error: Int32 = 0) {
        loop.preconditionInLoop()
        guard !isClosed else { return }
        let stopRead = gate.close()
        closeError = error
        if stopRead { uv_read_stop(stream) }
        backlog = []
        releaseWaiters()
        handle.close()
    }
    private var closeError: Int32 = 0

    /// libuv's close callback (`UVHandle`): the connection's last event.
    public func handleDidClose() {
        let cb = onClose
        onLine = { _ in }
        onOversized = { _, _ in }
        onClose = { _ in }
        onEOF = nil
        writer.onWritten = { _ in }
        cb(closeError)
    }
}
