import CHTTPParser
import CLibUV
import PylonCore

#if canImport(Glibc)
import Glibc
#endif

/// Shared read buffer: every read is parsed synchronously on the loop thread, so one suffices.
nonisolated(unsafe) private let readBuffer = UnsafeMutablePointer<CChar>.allocate(capacity: Limits.readBufferSize)

/// What the application decided for one request.
package enum Disposition {
    /// Answer with `response`, after `delayMs` (injected latency; 0 = at once).
    case respond(HTTPResponse, delayMs: UInt64)
    /// Answer nothing and close the connection (injected "dropped connection").
    case drop
    /// Answer when `answer` is given one (`DeferredAnswer.answer`): the ingest path in NATS mode
    /// answers once JetStream acknowledged. The application bounds the wait (its own deadline
    /// answers 503); until then the connection answers nothing after this request, as with a
    /// response held back by injected latency.
    case later(DeferredAnswer)
    /// Answer a `200` head without a length, then write the body as `stream` is given it,
    /// until either side ends (Server-Sent Events, `Backend+Tail.swift`). Requests pipelined
    /// after this one are not answered.
    case stream(ResponseStream)
}

/// A response body written as it is produced (`Disposition.stream`). Loop thread only.
package final class ResponseStream {
    /// The head's `Content-Type`.
    let contentType: String
    /// Unwritten bytes the client may fall behind by: a `send` beyond it closes the connection.
    let maxBufferedBytes: Int
    fileprivate var write: (([UInt8]) -> Bool)?
    fileprivate var end: (() -> Void)?
    /// Runs once when the connection closes (the client left, was too slow, or `finish`).
    var onClose: () -> Void = {}

    init(contentType: String, maxBufferedBytes: Int) {
        self.contentType = contentType
        self.maxBufferedBytes = maxBufferedBytes
    }

    /// Queues `bytes`; false when the connection is gone or was closed for falling behind.
    @discardableResult func send(_ bytes: [UInt8]) -> Bool { write?(bytes) ?? false }

    /// Ends the body (the connection then closes).
    func finish() { end?() }

    fileprivate func closed() {
        write = nil
        end = nil
        let c = onClose
        onClose = {}
        c()
    }
}

/// A response the application gives after `handle` returned (`Disposition.later`). Loop thread
/// only. Answered at most once; an answer for a connection that closed meanwhile is dropped.
package final class DeferredAnswer {
    private var deliver: ((HTTPResponse) -> Void)?
    /// An answer given before the connection took the request (kept until `take`).
    private var early: HTTPResponse?
    private(set) var answered = false
    /// Sees the response as it is given (the backend's request counters).
    var observer: ((HTTPResponse) -> Void)?

    package init() {}

    /// Gives the response (ignored after the first).
    func answer(_ response: HTTPResponse) {
        guard !answered else { return }
        answered = true
        observer?(response)
        if let d = deliver {
            deliver = nil
            d(response)
        } else {
            early = response
        }
    }

    /// Called by the connection: the response if it was already given, else nil and `deliver`
    /// is called with it later.
    fileprivate func take(_ deliver: @escaping (HTTPResponse) -> Void) -> HTTPResponse? {
        if let e = early {
            early = nil
            return e
        }
        if !answered { self.deliver = deliver }
        return nil
    }

    /// The connection closed: a later answer goes nowhere.
    fileprivate func cancel() { deliver = nil }
}

/// One accepted HTTP/1.1 client connection on a `uv_tcp_t`.
///
/// Requests are parsed by http-parser (see `HTTPConnection+Parsing.swift`) into a queue and
/// answered strictly in order, one at a time: a pipelined request is handed to `handler` only
/// after the response to the one before it has been queued for writing (or its injected delay
/// has passed). Parse errors and oversize requests become a final error response.
///
/// Memory stays bounded however much a client pipelines without reading: the parser pauses
/// after a request that fills the queue (`Limits.maxQueuedRequests`, `maxQueuedBodyBytes`)
/// or when output is backed up, keeping the rest of that read unparsed; above
/// `Limits.maxPendingOutput` of unwritten responses no further request is answered; and the
/// connection stops reading while either holds. It resumes at `Limits.pendingOutputLowWater`.
///
/// Deadlines (`ConnectionDeadlines`, one timer): idle between requests, request head, request
/// body; a late head or body is answered 408, an idle connection is closed.
///
/// Closing is graceful: once the last response is written the write side is shut down and
/// input is read and discarded until the client closes or `Limits.lingerMs` passes, so a
/// client still sending a rejected body receives the error instead of a reset.
///
/// Memory: the socket is a `UVHandle`, whose retained reference to the connection is released
/// in `uv_close`'s callback; the handle, parser and shutdown request are freed in `deinit`,
/// which can run only after that. Output goes through a `StreamWriter`.
final class HTTPConnection: UVHandleOwner {
    enum State {
        /// Reading and answering requests.
        case open
        /// No further requests are parsed (error, `Connection: close`, dropped, or the client
        /// shut down its side); the queue is answered, then the connection lingers or closes.
        case ending
        /// Everything is answered and the write side is shut down; input is discarded.
        case lingering
        case closed
    }

    /// An entry of the in-order queue: a request, or a terminal error found while parsing.
    enum Item {
        case request(HTTPRequest)
        case reject(APIError)
    }

    let loop: Loop
    let handle: UVHandle<uv_tcp_t>
    let parser: UnsafeMutablePointer<http_parser>
    private let shutdownReq: UnsafeMutablePointer<uv_shutdown_t>
    private let writer: StreamWriter
    /// `writer.pending`: responses are serialized into it.
    private let pending: ByteBuffer
    /// The server-wide budget of queued response bytes (`Limits.defaultMaxOutputBytes`).
    var budget: OutputBudget?
    /// This connection's share of `budget.used` (its `writer.queuedBytes` when last accounted).
    private var accounted = 0
    private var reading = false
    private(set) var state = State.open
    /// The client shut down its sending side (EOF).
    private var peerDone = false

    private var queue: [Item] = []
    private var queueHead = 0
    /// Body bytes of the requests in `queue`.
    private var queuedBodyBytes = 0
    /// The parser is paused (`http_parser_pause`) at a request boundary; `unparsed` holds the
    /// bytes of the last read it had not reached.
    private var parserPaused = false
    private var unparsed: [UInt8] = []
    /// More than `Limits.maxPendingOutput` bytes were queued for writing and they have not yet
    /// drained to `Limits.pendingOutputLowWater`: answer, parse and read nothing more.
    private var outputBlocked = false
    /// A response held back by injected latency, and how to frame it.
    private var held: (response: HTTPResponse, framing: Framing)?
    /// A request answered later (`Disposition.later`), and how to frame its response.
    private var awaiting: (answer: DeferredAnswer, framing: Framing)?
    /// The streamed response being written (`Disposition.stream`).
    private var streaming: ResponseStream?
    private var delayTimer: Timer?
    /// Armed for the deadline in force (`armDeadline`), or for the linger period.
    private var deadlineTimer: Timer?
    /// Also advanced by the parser callbacks at request boundaries.
    var deadlines: ConnectionDeadlines
    /// Accept order, to break ties between equally idle connections.
    let serial: UInt64
    /// The client's address without the port (`HTTPRequest.peer`), read once at `start`.
    private(set) var peer = ""

    /// The request being parsed (used by the parser callbacks).
    var partial = PartialRequest()
    /// Why the parser callbacks stopped the parser, if they did.
    var rejection: APIError?
    let maxBody: Int

    /// Decides each request's response; called in request order, on the loop thread.
    var handler: (HTTPRequest) -> Disposition = { _ in .drop }
    /// Runs once, when the connection closes (from `close()`, before libuv has released the
    /// socket), so a closed connection no longer counts against the server's limit.
    var onClose: () -> Void = {}

    /// An unconnected TCP handle, ready for `uv_accept`.
    init(loop: Loop, maxBody: Int, timeouts: Timeouts, serial: UInt64) {
        self.loop = loop
        self.maxBody = maxBody
        self.serial = serial
        deadlines = ConnectionDeadlines(timeouts: timeouts, now: loop.nowMs)
        let h = UVHandle<uv_tcp_t>()
        uv_tcp_init(loop.uv, h.pointer)
        writer = StreamWriter(stream: asStream(h.pointer))
        pending = writer.pending
        handle = h
        parser = .allocate(capacity: 1)
        parser.initialize(to: http_parser())
        shutdownReq = .allocate(capacity: 1)
        shutdownReq.initialize(to: uv_shutdown_t())
        handle.retain(self)
        let me = Unmanaged.passUnretained(self).toOpaque()
        shutdownReq.pointee.data = me
        http_parser_init(parser, HTTP_REQUEST)
        parser.pointee.data = me
        writer.onWritten = { [unowned self] status in self.didWrite(status) }
    }

    deinit {
        // Only reachable after the close callback released the handle's reference (the
        // handle's own memory goes with `handle`).
        parser.deallocate()
        shutdownReq.deallocate()
    }

    var stream: UnsafeMutablePointer<uv_stream_t> { asStream(handle.pointer) }

    /// Starts serving an accepted connection.
    func start() {
        uv_tcp_nodelay(handle.pointer, 1)
        peer = HTTPConnection.peerName(handle.pointer)
        deadlineTimer = Timer(loop: loop) { [weak self] in self?.deadlineFired() }
        startReading()
        armDeadline()
    }

    /// The peer address of `tcp` as text (IPv4 or IPv6, no port); empty when unknown.
    private static func peerName(_ tcp: UnsafeMutablePointer<uv_tcp_t>) -> String {
        var addr = sockaddr_storage()
        var len = Int32(MemoryLayout<sockaddr_storage>.size)
        var name = [CChar](repeating: 0, count: 64)
        return withUnsafeMutablePointer(to: &addr) { p -> String in
            let raw = UnsafeMutableRawPointer(p)
            guard uv_tcp_getpeername(tcp, raw.assumingMemoryBound(to: sockaddr.self), &len) == 0 else { return "" }
            if Int32(p.pointee.ss_family) == AF_INET6 {
                uv_ip6_name(raw.assumingMemoryBound(to: sockaddr_in6.self), &name, name.count)
            } else {
                uv_ip4_name(raw.assumingMemoryBound(to: sockaddr_in.self), &name, name.count)
            }
            return String(decoding: name.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        }
    }

    /// Answers `error` without reading any request, then closes (used when over a limit).
    func refuse(_ error: APIError) {
        deadlineTimer = Timer(loop: loop) { [weak self] in self?.deadlineFired() }
        state = .ending
        emit(HTTPResponse(error), Framing(close: true, headOnly: false))
        flush()
        maybeFinish()
        armDeadline()
    }

    /// When the server is full, which connection makes room first (smallest first): lingering
    /// ones, then the one idle longest (`ConnectionDeadlines.idleSince`: partial bytes do not
    /// make a connection recent). Nil for a connection that must not be closed: one whose
    /// response is held back by injected latency, which is the harness's work in progress.
    var evictionRank: (tier: Int, idleSince: UInt64, serial: UInt64)? {
        switch state {
        case .closed: nil
        case .lingering: (0, 0, serial)
        case .open, .ending: held != nil || awaiting != nil ? nil : (1, deadlines.idleSince, serial)
        }
    }

    /// Closes at once to make room for a new connection. A client in the middle of sending a
    /// request, with nothing else outstanding, is first told `error` (one non-blocking write,
    /// best effort); an idle one is closed silently.
    func evict(_ error: APIError) {
        if state == .open, queueHead == queue.count, writer.queuedBytes == 0,
            deadlines.phase != .betweenRequests
        {
            _ = HTTPResponse(error).serialized(close: true).withUnsafeBytes { writer.writeNowOrDrop($0) }
        }
        close()
    }

    // MARK: Reading

    private func startReading() {
        guard !reading, state != .closed, !peerDone else { return }
        reading = true
        uv_read_start(
            stream,
            { _, _, buf in
                buf!.pointee = pylon_buf(readBuffer, Limits.readBufferSize)
            },
            { s, nread, _ in
                Unmanaged<HTTPConnection>.fromOpaque(s!.pointee.data).takeUnretainedValue().didRead(nread)
            })
    }

    private func stopReading() {
        guard reading, state != .closed else { return }
        reading = false
        uv_read_stop(stream)
    }

    /// Reads while open and neither paused nor backpressured; in `ending` and `lingering` input
    /// is drained and discarded so a client blocked writing a rejected body can finish and see
    /// the answer.
    private func updateReading() {
        switch state {
        case .open:
            if parserPaused || backlogged {
                stopReading()
            } else if !reading {
                deadlines.readingResumed(at: loop.nowMs)
                startReading()
            }
        case .ending, .lingering: startReading()
        case .closed: break
        }
    }

    /// The queue or the output is full: parse and answer nothing more for now.
    private var backlogged: Bool {
        outputBlocked || queue.count - queueHead >= Limits.maxQueuedRequests
            || queuedBodyBytes >= Limits.maxQueuedBodyBytes
    }

    private func didRead(_ nread: Int) {
        if nread < 0 {
            if nread == Int(UV_EOF.rawValue) {
                peerEOF()
            } else {
                close()
            }
            return
        }
        guard nread > 0 else { return }
        // Unless open, the bytes are discarded (see `updateReading`). Partial bytes move no
        // deadline by themselves: the parser callbacks report request boundaries.
        guard state == .open else { return }
        let bytes = UnsafeRawBufferPointer(start: readBuffer, count: nread)
        let used = parse(bytes)
        if used < nread { unparsed.append(contentsOf: bytes[used...]) }
        pump()
    }

    private func peerEOF() {
        reading = false
        peerDone = true
        switch state {
        case .open:
            state = .ending
            pump()
        case .ending: maybeFinish()
        case .lingering: close()
        case .closed: break
        }
    }

    /// Feeds bytes to http-parser; complete requests and a terminal error land in the queue.
    /// Returns how many bytes were used: fewer than given only when the parser paused.
    private func parse(_ bytes: UnsafeRawBufferPointer) -> Int {
        guard let base = bytes.baseAddress?.assumingMemoryBound(to: CChar.self) else { return 0 }
        let used = http_parser_execute(parser, parserSettings, base, bytes.count)
        guard state == .open else { return bytes.count }  // `Connection: close` seen: the rest is ignored
        let errno = pylon_http_errno(parser)
        if errno == HPE_PAUSED.rawValue {
            return used
        } else if errno != HPE_OK.rawValue {
            queue.append(.reject(rejection ?? HTTPConnection.parseError(errno)))
            state = .ending
        } else if parser.pointee.upgrade != 0 {
            state = .ending  // protocol upgrades are not supported; answer and close
        }
        return bytes.count
    }

    /// Unpauses the parser and feeds it the bytes it left, once the queue and the output have
    /// room. True when it parsed something (so there may be new requests to answer).
    private func resumeParsing() -> Bool {
        guard state == .open, parserPaused, !backlogged else { return false }
        http_parser_pause(parser, 0)
        parserPaused = false
        guard !unparsed.isEmpty else { return false }
        let bytes = unparsed
        unparsed = []
        let used = bytes.withUnsafeBytes { parse($0) }
        if used < bytes.count { unparsed = Array(bytes[used...]) }
        return true
    }

    /// Called by the parser callbacks with each complete request. Pauses the parser (which
    /// stops at the end of this request) when the queue or the output is full.
    func enqueue(_ request: HTTPRequest) {
        queue.append(.request(request))
        queuedBodyBytes += request.body.count
        deadlines.messageCompleted(at: loop.nowMs)
        if !request.keepAlive {
            state = .ending
        } else if backlogged {
            http_parser_pause(parser, 1)
            parserPaused = true
        }
    }

    /// True when a `100 Continue` written now would not overtake an earlier response.
    var canSendContinue: Bool { queue.count == queueHead && held == nil && awaiting == nil && state == .open }

    /// Queues a `100 Continue` interim response (flushed after the current read).
    func sendContinue() { pending.append("HTTP/1.1 100 Continue\r\n\r\n") }

    private static func parseError(_ errno: UInt32) -> APIError {
        let what = String(cString: http_errno_description(http_errno(rawValue: errno)))
        if errno == HPE_HEADER_OVERFLOW.rawValue {
            return APIError(
                status: 431, code: .headerTooLarge,
                message: "request line and headers exceed \(Limits.maxHeaderBytes) bytes")
        }
        return .badRequest(.malformedHTTP, "malformed HTTP request: \(what)")
    }

    // MARK: Answering, in order

    /// Answers queued requests and parses what the parser left, until a response is held back
    /// by injected latency, the output is backed up, or there is nothing left to do; then
    /// writes, adjusts reading and re-arms the deadline.
    private func pump() {
        updateOutputBlocked()
        repeat { answerQueued() } while resumeParsing()
        flush()
        updateReading()
        maybeFinish()
        armDeadline()
    }

    /// Answers queued requests until one is held back by injected latency, the output is over
    /// `Limits.maxPendingOutput`, or the queue is empty.
    private func answerQueued() {
        while held == nil, awaiting == nil, !outputBlocked, state == .open || state == .ending, queueHead < queue.count {
            let item = queue[queueHead]
            queueHead += 1
            switch item {
            case .reject(let error):
                emit(HTTPResponse(error), Framing(close: true, headOnly: false))
            case .request(let request):
                queuedBodyBytes -= request.body.count
                let framing = Framing(close: !request.keepAlive, headOnly: request.method == "HEAD")
                switch handler(request) {
                case .drop:
                    discardQueue()
                case .respond(let response, let delayMs) where delayMs > 0:
                    held = (response, framing)
                    if delayTimer == nil { delayTimer = Timer(loop: loop) { [weak self] in self?.releaseHeld() } }
                    delayTimer?.start(after: delayMs)
                case .respond(let response, _):
                    emit(response, framing)
                case .later(let answer):
                    if let response = answer.take({ [weak self] r in self?.deliverLater(r) }) {
                        emit(response, framing)
                    } else {
                        awaiting = (answer, framing)
                    }
                case .stream(let s):
                    startStream(s)
                }
            }
            if writer.queuedBytes > Limits.maxPendingOutput { flush() }
            updateOutputBlocked()
        }
        if queueHead == queue.count {
            queue.removeAll(keepingCapacity: true)
            queueHead = 0
        }
    }

    /// Writes the head of a streamed response; its body follows through `s`.
    private func startStream(_ s: ResponseStream) {
        pending.append(
            "HTTP/1.1 200 OK\r\nContent-Type: \(s.contentType)\r\nCache-Control: no-cache\r\n"
                + "X-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n")
        account()
        discardQueue()
        streaming = s
        s.write = { [weak self] bytes in self?.streamWrite(bytes) ?? false }
        s.end = { [weak self] in self?.streamEnd() }
    }

    private func streamWrite(_ bytes: [UInt8]) -> Bool {
        guard let s = streaming, state != .closed else { return false }
        if writer.queuedBytes + bytes.count > s.maxBufferedBytes {
            close()
            return false
        }
        bytes.withUnsafeBytes { pending.append($0) }
        flush()
        return state != .closed
    }

    private func streamEnd() {
        guard streaming != nil, state != .closed else { return }
        let s = streaming
        streaming = nil
        s?.closed()
        pump()
    }

    /// Blocks above the high-water mark, unblocks at the low-water mark.
    private func updateOutputBlocked() {
        if writer.queuedBytes > Limits.maxPendingOutput {
            outputBlocked = true
        } else if writer.queuedBytes <= Limits.pendingOutputLowWater {
            outputBlocked = false
        }
    }

    /// The deferred answer arrived: write it and go on with the queue.
    private func deliverLater(_ response: HTTPResponse) {
        guard let a = awaiting, state != .closed else { return }
        awaiting = nil
        emit(response, a.framing)
        pump()
    }

    private func releaseHeld() {
        guard let h = held else { return }
        held = nil
        emit(h.response, h.framing)
        pump()
    }

    /// How a response goes on the wire: `close` adds `Connection: close` and ends the
    /// connection after it; `headOnly` (a `HEAD` request) leaves the body out.
    private struct Framing {
        var close: Bool
        var headOnly: Bool
    }

    /// Queues a response; a closing one ends the connection and discards anything after it.
    private func emit(_ response: HTTPResponse, _ framing: Framing) {
        var bytes = response.serialized(close: framing.close, headOnly: framing.headOnly)
        if let b = budget, bytes.count > Limits.smallResponseBytes, b.used > 0, b.used + bytes.count > b.limit {
            b.refused += 1
            let busy = APIError(
                status: 503, code: .serverBusy,
                message: "\(b.used) response bytes are waiting for their clients (limit \(b.limit)); retry", retryAfter: 1)
            bytes = HTTPResponse(busy).serialized(close: framing.close, headOnly: framing.headOnly)
        }
        bytes.withUnsafeBytes { pending.append($0) }
        account()
        if framing.close { discardQueue() }
    }

    /// Brings `budget.used` up to date with this connection's queued bytes.
    private func account() {
        let q = state == .closed ? 0 : writer.queuedBytes
        budget?.used += q - accounted
        accounted = q
    }

    private func discardQueue() {
        queue.removeAll()
        queueHead = 0
        queuedBodyBytes = 0
        unparsed = []
        if state == .open { state = .ending }
    }

    // MARK: Writing

    /// Writes queued bytes (`StreamWriter.flush`: `uv_try_write`, the rest with one `uv_write`).
    private func flush() {
        guard state != .closed else { return }
        let before = writer.queuedBytes
        if writer.flush() < 0 {
            close()
            return
        }
        account()
        // Bytes the kernel took at once count as progress for the deadlines.
        if writer.queuedBytes < before { deadlines.wrote(at: loop.nowMs) }
    }

    private func didWrite(_ status: Int32) {
        guard state != .closed else { return }
        if status < 0 {
            close()
            return
        }
        deadlines.wrote(at: loop.nowMs)
        account()
        pump()
    }

    // MARK: Closing

    /// In `ending`, once everything is answered and written: close if the client already shut
    /// down, else shut down our side and linger.
    private func maybeFinish() {
        if streaming != nil {
            if peerDone { close() }
            return
        }
        guard state == .ending, queueHead == queue.count, held == nil, awaiting == nil, writer.queuedBytes == 0 else {
            return
        }
        if peerDone {
            close()
            return
        }
        state = .lingering
        deadlineTimer?.start(after: Limits.lingerMs)
        let rc = uv_shutdown(shutdownReq, stream) { req, status in
            let c = Unmanaged<HTTPConnection>.fromOpaque(req!.pointee.data).takeUnretainedValue()
            if status < 0 { c.close() }
        }
        if rc < 0 { close() } else { startReading() }
    }

    // MARK: Deadlines

    /// The deadline in force while open or ending (`lingering` has its own, set once).
    private var currentDeadline: (at: UInt64, expiry: ConnectionDeadlines.Expiry)? {
        deadlines.next(reading: state == .open && reading, held: held != nil || awaiting != nil || streaming != nil)
    }

    /// Arms the timer for the deadline in force, or stops it when none is.
    private func armDeadline() {
        guard state == .open || state == .ending else { return }
        guard let d = currentDeadline else {
            deadlineTimer?.stop()
            return
        }
        let now = loop.nowMs
        deadlineTimer?.start(after: d.at > now ? d.at - now : 0)
    }

    private func deadlineFired() {
        switch state {
        case .lingering: close()
        case .closed: break
        case .open, .ending:
            guard let d = currentDeadline else { return }
            guard d.at <= loop.nowMs else {
                armDeadline()
                return
            }
            switch d.expiry {
            case .idle:
                close()
            case .header, .body:
                let what = d.expiry == .header ? "request head" : "request body"
                let ms = d.expiry == .header ? deadlines.timeouts.headerMs : deadlines.timeouts.bodyMs
                queue.append(
                    .reject(
                        APIError(
                            status: 408, code: .requestTimeout,
                            message: "\(what) not received within \(ms) ms")))
                state = .ending
                pump()
            }
        }
    }

    /// Closes at once (`uv_close`); pending output is discarded. Safe to call more than once.
    func close() {
        guard state != .closed else { return }
        state = .closed
        if reading { uv_read_stop(stream) }
        reading = false
        awaiting?.answer.cancel()
        awaiting = nil
        let s = streaming
        streaming = nil
        s?.closed()
        delayTimer?.close()
        deadlineTimer?.close()
        delayTimer = nil
        deadlineTimer = nil
        let cb = onClose
        onClose = {}
        handler = { _ in .drop }
        account()
        handle.close()
        cb()
    }
}
