import CCurl
import CLibUV
import PylonCore

/// One HTTP request for `HTTPClient.send`.
public struct HTTPRequest: Sendable {
    public var method: String
    public var url: String
    public var headers: [(String, String)]
    public var body: [UInt8]
    /// Whole-transfer timeout.
    public var timeoutMs: Int
    /// The largest response body kept; a longer one fails the transfer ("response larger than
    /// N bytes"). Without it a backend streaming gigabytes grew a plugin to 3 GB in 18 s.
    public var maxResponseBytes: Int
    /// The default `maxResponseBytes`: the backend's answers are small JSON documents.
    public static let defaultMaxResponseBytes = 4 << 20
    /// The most response header lines kept, and their bytes in all; past them the transfer fails.
    public static let maxHeaderLines = 100
    public static let maxHeaderBytes = 64 * 1024

    public init(
        method: String = "GET", url: String, headers: [(String, String)] = [], body: [UInt8] = [], timeoutMs: Int = 30_000,
        maxResponseBytes: Int = HTTPRequest.defaultMaxResponseBytes
    ) {
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
        self.timeoutMs = timeoutMs
        self.maxResponseBytes = maxResponseBytes
    }
}

public struct HTTPResponse: Sendable {
    public var status: Int
    /// Header names lower-cased; the last value wins.
    public var headers: [String: String]
    public var body: [UInt8]
    public var bodyText: String { String(decoding: body, as: UTF8.self) }

    /// `Retry-After` in milliseconds (delta-seconds form), if present; `UInt64.max` for more
    /// seconds than that holds (the caller caps it).
    public var retryAfterMs: UInt64? { headers["retry-after"].flatMap(HTTPResponse.retryAfterMs) }

    /// A `Retry-After` value (delta-seconds) in milliseconds, `UInt64.max` when too large.
    public static func retryAfterMs(_ value: String) -> UInt64? {
        guard let s = UInt64(value.trimmingSpaces) else { return nil }
        let (ms, overflow) = s.multipliedReportingOverflow(by: 1000)
        return overflow ? .max : ms
    }
}

/// A transfer that did not produce an HTTP response (DNS, connect, timeout, reset, TLS...).
public struct HTTPClientError: Error, CustomStringConvertible, Sendable {
    public let code: Int32
    public let description: String
    /// The transfer was cut because the response passed `maxResponseBytes` or the header limits.
    public var responseTooLarge = false
}

/// An asynchronous HTTP client on the process's libuv loop: libcurl's multi-socket API, with
/// one `uv_poll_t` per socket curl asks about and one `uv_timer_t` for curl's timeouts (the
/// shape of curl's `multi-uv.c`). Completion callbacks run on the loop.
public final class HTTPClient {
    let loop: Loop
    /// libcurl's multi handle, made by the first request: a process that never sends one never
    /// opens libcurl and its dependency tree (opened on first use: Sources/CLazyCurl).
    private var multiHandle: UnsafeMutableRawPointer?
    private var timer: Timer!
    private var transfers: [UnsafeMutableRawPointer: Transfer] = [:]
    private var closed = false

    public init(loop: Loop) {
        self.loop = loop
        timer = Timer(loop: loop) { [unowned self] in self.onTimeout() }
    }

    var multi: UnsafeMutableRawPointer {
        if let multiHandle { return multiHandle }
        HTTPClient.globalInit()
        let multi: UnsafeMutableRawPointer = curl_multi_init()
        let me = Unmanaged.passUnretained(self).toOpaque()
        _ = pylon_multi_setopt_socket_cb(multi) { easy, s, action, userp, socketp in
            Unmanaged<HTTPClient>.fromOpaque(userp!).takeUnretainedValue().socketCallback(s, action, socketp)
            return 0
        }
        _ = pylon_multi_setopt_ptr(multi, CURLMOPT_SOCKETDATA, me)
        _ = pylon_multi_setopt_timer_cb(multi) { _, timeoutMs, userp in
            Unmanaged<HTTPClient>.fromOpaque(userp!).takeUnretainedValue().timerCallback(timeoutMs)
            return 0
        }
        _ = pylon_multi_setopt_ptr(multi, CURLMOPT_TIMERDATA, me)
        multiHandle = multi
        return multi
    }

    /// The only URL schemes a transfer may use (`CURLOPT_PROTOCOLS_STR`, also for redirects).
    public static let protocols = "http,https"

    nonisolated(unsafe) private static var initialized = false
    private static func globalInit() {
        if !initialized {
            curl_global_init(Int(CURL_GLOBAL_DEFAULT))
            initialized = true
        }
    }

    /// Starts a request; `done` is called exactly once on the loop.
    public func send(_ request: HTTPRequest, _ done: @escaping (Result<HTTPResponse, HTTPClientError>) -> Void) {
        let refused = HTTPClientError(code: -1, description: "HTTP client closed")
        guard !closed else { return done(.failure(refused)) }
        // The multi handle first: it makes libcurl's global state before the first easy handle.
        let multi = multi
        guard let easy = curl_easy_init() else { return done(.failure(refused)) }
        let t = Transfer(request: request, done: done)
        transfers[easy] = t
        let tp = Unmanaged.passUnretained(t).toOpaque()
        _ = pylon_easy_setopt_str(easy, CURLOPT_URL, request.url)
        // Pylon speaks HTTP and nothing else: without this a URL could make curl write raw TCP
        // (gopher://, telnet://, dict://), read local files (file://) and so on. Redirects are
        // not followed (curl's default, set explicitly): where data goes is configuration.
        _ = pylon_easy_setopt_str(easy, CURLOPT_PROTOCOLS_STR, HTTPClient.protocols)
        _ = pylon_easy_setopt_str(easy, CURLOPT_REDIR_PROTOCOLS_STR, HTTPClient.protocols)
        _ = pylon_easy_setopt_long(easy, CURLOPT_FOLLOWLOCATION, 0)
        _ = pylon_easy_setopt_long(easy, CURLOPT_NOSIGNAL, 1)
        _ = pylon_easy_setopt_long(easy, CURLOPT_TIMEOUT_MS, request.timeoutMs)
        _ = pylon_easy_setopt_long(easy, CURLOPT_CONNECTTIMEOUT_MS, min(request.timeoutMs, 10_000))
        _ = pylon_easy_setopt_str(easy, CURLOPT_USERAGENT, "pylon/0.1")
        _ = pylon_easy_setopt_write_cb(easy) { ptr, size, n, ud in
            let t = Unmanaged<Transfer>.fromOpaque(ud!).takeUnretainedValue()
            // Past the limit: a short count makes curl abort the transfer (CURLE_WRITE_ERROR).
            guard t.body.count + size * n <= t.maxResponseBytes else {
                t.tooLarge = "response larger than \(t.maxResponseBytes) bytes"
                return 0
            }
            t.body.append(contentsOf: UnsafeRawBufferPointer(start: ptr, count: size * n))
            return size * n
        }
        _ = pylon_easy_setopt_ptr(easy, CURLOPT_WRITEDATA, tp)
        _ = pylon_easy_setopt_header_cb(easy) { ptr, size, n, ud in
            let t = Unmanaged<Transfer>.fromOpaque(ud!).takeUnretainedValue()
            t.headerLines += 1
            t.headerBytes += size * n
            guard t.headerLines <= HTTPRequest.maxHeaderLines, t.headerBytes <= HTTPRequest.maxHeaderBytes else {
                t.tooLarge = "response headers beyond \(HTTPRequest.maxHeaderLines) lines or \(HTTPRequest.maxHeaderBytes) bytes"
                return 0
            }
            t.headerLine(UnsafeRawBufferPointer(start: ptr, count: size * n))
            return size * n
        }
        _ = pylon_easy_setopt_ptr(easy, CURLOPT_HEADERDATA, tp)
        if request.method == "POST" || request.method == "PUT" || !request.body.isEmpty {
            _ = pylon_easy_setopt_long(easy, CURLOPT_POST, 1)
            _ = pylon_easy_setopt_off(easy, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(t.bodyCount))
            _ = pylon_easy_setopt_ptr(easy, CURLOPT_POSTFIELDS, t.bodyPointer)
        }
        if request.method != "GET" && request.method != "POST" {
            _ = pylon_easy_setopt_str(easy, CURLOPT_CUSTOMREQUEST, request.method)
        }
        var list: UnsafeMutablePointer<curl_slist>?
        // Disable curl's "Expect: 100-continue" round trip for bodies.
        list = curl_slist_append(list, "Expect:")
        for (k, v) in request.headers { list = curl_slist_append(list, "\(k): \(v)") }
        t.headerList = list
        _ = pylon_easy_setopt_ptr(easy, CURLOPT_HTTPHEADER, UnsafeMutableRawPointer(list))
        curl_multi_add_handle(multi, easy)
    }

    // MARK: curl → libuv

    private func socketCallback(_ s: curl_socket_t, _ action: Int32, _ socketp: UnsafeMutableRawPointer?) {
        if action == CURL_POLL_REMOVE {
            if let socketp {
                Unmanaged<SocketPoll>.fromOpaque(socketp).takeUnretainedValue().close()
                curl_multi_assign(multi, s, nil)
            }
            return
        }
        let poll: SocketPoll
        if let socketp {
            poll = Unmanaged<SocketPoll>.fromOpaque(socketp).takeUnretainedValue()
        } else {
            poll = SocketPoll(loop: loop, fd: s) { [unowned self] status, events in
                self.onSocketEvent(s, status: status, events: events)
            }
            curl_multi_assign(multi, s, Unmanaged.passUnretained(poll).toOpaque())
        }
        var events: Int32 = 0
        if action == CURL_POLL_IN || action == CURL_POLL_INOUT { events |= Int32(UV_READABLE.rawValue) }
        if action == CURL_POLL_OUT || action == CURL_POLL_INOUT { events |= Int32(UV_WRITABLE.rawValue) }
        poll.watch(events)
    }

    private func timerCallback(_ timeoutMs: Int) {
        if timeoutMs < 0 {
            timer.stop()
        } else {
            // Never call back into curl from inside its own callback: arm a timer (0 → 1 ms).
            timer.start(after: UInt64(max(timeoutMs, 1)))
        }
    }

    private func onTimeout() {
        var running: Int32 = 0
        curl_multi_socket_action(multi, CURL_SOCKET_TIMEOUT, 0, &running)
        drain()
    }

    fileprivate func onSocketEvent(_ fd: curl_socket_t, status: Int32, events: Int32) {
        var flags: Int32 = 0
        if status < 0 {
            flags = CURL_CSELECT_ERR
        } else {
            if events & Int32(UV_READABLE.rawValue) != 0 { flags |= CURL_CSELECT_IN }
            if events & Int32(UV_WRITABLE.rawValue) != 0 { flags |= CURL_CSELECT_OUT }
        }
        var running: Int32 = 0
        curl_multi_socket_action(multi, fd, flags, &running)
        drain()
    }

    /// Completes every finished transfer (`curl_multi_info_read`).
    private func drain() {
        var left: Int32 = 0
        while let msg = curl_multi_info_read(multi, &left) {
            guard msg.pointee.msg == CURLMSG_DONE, let easy = msg.pointee.easy_handle else { continue }
            let code = msg.pointee.data.result
            curl_multi_remove_handle(multi, easy)
            guard let t = transfers.removeValue(forKey: easy) else {
                curl_easy_cleanup(easy)
                continue
            }
            var status = 0
            pylon_easy_getinfo_long(easy, CURLINFO_RESPONSE_CODE, &status)
            let result: Result<HTTPResponse, HTTPClientError>
            if code == CURLE_OK {
                result = .success(HTTPResponse(status: status, headers: t.headers, body: t.body))
            } else if let why = t.tooLarge {
                result = .failure(HTTPClientError(code: Int32(code.rawValue), description: why, responseTooLarge: true))
            } else {
                result = .failure(HTTPClientError(code: Int32(code.rawValue), description: String(cString: curl_easy_strerror(code))))
            }
            curl_easy_cleanup(easy)
            t.finish()
            t.done(result)
        }
    }

    /// Cancels every transfer (their callbacks get an error) and frees curl and libuv resources.
    /// Call explicitly; never from deinit (curl calls back into the client while cleaning up).
    public func shutdown() {
        guard !closed else { return }
        closed = true
        for (easy, t) in transfers {
            curl_multi_remove_handle(multi, easy)
            curl_easy_cleanup(easy)
            t.finish()
            t.done(.failure(HTTPClientError(code: -1, description: "HTTP client shut down")))
        }
        transfers.removeAll()
        if let multiHandle { curl_multi_cleanup(multiHandle) }
        timer.close()
    }
}

/// One transfer's buffers. The request body is copied to stable memory that curl reads from
/// (`CURLOPT_POSTFIELDS` does not copy).
final class Transfer {
    let done: (Result<HTTPResponse, HTTPClientError>) -> Void
    var body: [UInt8] = []
    var headers: [String: String] = [:]
    let maxResponseBytes: Int
    var headerLines = 0
    var headerBytes = 0
    /// Why the transfer was cut short by a limit, if it was.
    var tooLarge: String?
    var headerList: UnsafeMutablePointer<curl_slist>?
    let bodyPointer: UnsafeMutableRawPointer?
    let bodyCount: Int

    init(request: HTTPRequest, done: @escaping (Result<HTTPResponse, HTTPClientError>) -> Void) {
        self.done = done
        maxResponseBytes = request.maxResponseBytes
        bodyCount = request.body.count
        if request.body.isEmpty {
            bodyPointer = nil
        } else {
            let p = UnsafeMutableRawPointer.allocate(byteCount: request.body.count, alignment: 1)
            request.body.withUnsafeBytes { p.copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
            bodyPointer = p
        }
    }

    func headerLine(_ raw: UnsafeRawBufferPointer) {
        let line = String(decoding: raw, as: UTF8.self)
        if line.hasPrefix("HTTP/") { headers.removeAll(); return }  // a new response (after 100 or redirect)
        guard let colon = line.firstIndex(of: ":") else { return }
        let name = line[..<colon].lowercased()
        let value = String(line[line.index(after: colon)...]).trimmingSpaces
        headers[name] = value
    }

    func finish() {
        curl_slist_free_all(headerList)
        headerList = nil
        bodyPointer?.deallocate()
    }
}

extension String {
    /// Without leading/trailing spaces, tabs, CR and LF. Works on scalars: "\r\n" is one Character.
    var trimmingSpaces: String {
        var s = Substring(self).unicodeScalars[...]
        let ws: (Unicode.Scalar) -> Bool = { $0 == " " || $0 == "\t" || $0 == "\r" || $0 == "\n" }
        while let f = s.first, ws(f) { s = s.dropFirst() }
        while let l = s.last, ws(l) { s = s.dropLast() }
        return String(String.UnicodeScalarView(s))
    }
}
