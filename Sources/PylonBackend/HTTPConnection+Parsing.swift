import CHTTPParser

/// The request being assembled by the http-parser callbacks. URL and header pieces may arrive
/// split across reads, so each is accumulated until the next element starts.
struct PartialRequest {
    var url: [UInt8] = []
    var headers: [(name: String, value: String)] = []
    var field: [UInt8] = []
    var value: [UInt8] = []
    var inValue = false
    var body: [UInt8] = []

    mutating func finishHeader() {
        guard inValue else { return }
        headers.append((String(decoding: field, as: UTF8.self).lowercased(), String(decoding: value, as: UTF8.self)))
        field.removeAll(keepingCapacity: true)
        value.removeAll(keepingCapacity: true)
        inValue = false
    }
}

/// The one `http_parser_settings` table. Each callback finds its `HTTPConnection` in
/// `parser->data` (unretained: the connection owns the parser). A non-zero return stops
/// http-parser with an `HPE_CB_*` error; the callback first records why in `rejection`.
nonisolated(unsafe) let parserSettings: UnsafeMutablePointer<http_parser_settings> = {
    http_parser_set_max_header_size(UInt32(Limits.maxHeaderBytes))
    let s = UnsafeMutablePointer<http_parser_settings>.allocate(capacity: 1)
    s.initialize(to: http_parser_settings())
    http_parser_settings_init(s)
    s.pointee.on_message_begin = { p in HTTPConnection.of(p).messageBegin() }
    s.pointee.on_url = { p, at, n in HTTPConnection.of(p).url(at, n) }
    s.pointee.on_header_field = { p, at, n in HTTPConnection.of(p).headerField(at, n) }
    s.pointee.on_header_value = { p, at, n in HTTPConnection.of(p).headerValue(at, n) }
    s.pointee.on_headers_complete = { p in HTTPConnection.of(p).headersComplete() }
    s.pointee.on_body = { p, at, n in HTTPConnection.of(p).body(at, n) }
    s.pointee.on_message_complete = { p in HTTPConnection.of(p).messageComplete() }
    return s
}()

extension HTTPConnection {
    static func of(_ p: UnsafeMutablePointer<http_parser>?) -> HTTPConnection {
        Unmanaged<HTTPConnection>.fromOpaque(p!.pointee.data).takeUnretainedValue()
    }

    fileprivate func messageBegin() -> Int32 {
        partial = PartialRequest()
        deadlines.messageBegan(at: loop.nowMs)
        return 0
    }

    fileprivate func url(_ at: UnsafePointer<CChar>?, _ n: Int) -> Int32 {
        append(&partial.url, at, n)
        return 0
    }

    fileprivate func headerField(_ at: UnsafePointer<CChar>?, _ n: Int) -> Int32 {
        if partial.inValue {
            partial.finishHeader()
            if partial.headers.count >= Limits.maxHeaderCount {
                rejection = APIError(
                    status: 431, code: .headerTooLarge,
                    message: "more than \(Limits.maxHeaderCount) header fields")
                return 1
            }
        }
        append(&partial.field, at, n)
        return 0
    }

    fileprivate func headerValue(_ at: UnsafePointer<CChar>?, _ n: Int) -> Int32 {
        partial.inValue = true
        append(&partial.value, at, n)
        return 0
    }

    /// Refuses HTTP versions other than 1.0 and 1.1 and a declared body over the limit before
    /// reading it, and answers `Expect: 100-continue` when nothing earlier is still unanswered.
    fileprivate func headersComplete() -> Int32 {
        partial.finishHeader()
        let p = parser.pointee
        guard p.http_major == 1, p.http_minor <= 1 else {
            rejection = APIError(
                status: 505, code: .httpVersionNotSupported,
                message: "HTTP/\(p.http_major).\(p.http_minor) is not supported (HTTP/1.1 or 1.0)")
            return -1
        }
        deadlines.headersCompleted(at: loop.nowMs)
        if p.flags & UInt32(F_CONTENTLENGTH.rawValue) != 0, p.content_length > UInt64(maxBody) {
            rejection = .tooLarge("request body of \(p.content_length) bytes exceeds the limit of \(maxBody)")
            return -1
        }
        let expects = partial.headers.contains { $0.name == "expect" && $0.value.lowercased() == "100-continue" }
        if expects && canSendContinue { sendContinue() }
        return 0
    }

    fileprivate func body(_ at: UnsafePointer<CChar>?, _ n: Int) -> Int32 {
        // Chunked bodies have no declared length: the limit is checked as they arrive.
        guard partial.body.count + n <= maxBody else {
            rejection = .tooLarge("request body exceeds the limit of \(maxBody) bytes")
            return 1
        }
        if partial.body.isEmpty, parser.pointee.flags & UInt32(F_CONTENTLENGTH.rawValue) != 0 {
            partial.body.reserveCapacity(Int(parser.pointee.content_length))
        }
        append(&partial.body, at, n)
        return 0
    }

    fileprivate func messageComplete() -> Int32 {
        let method = String(cString: http_method_str(http_method(rawValue: pylon_http_method(parser))))
        let request = HTTPRequest(
            method: method, target: String(decoding: partial.url, as: UTF8.self), headers: partial.headers,
            body: partial.body, peer: peer, keepAlive: pylon_http_should_keep_alive(parser) != 0)
        partial = PartialRequest()
        enqueue(request)
        return 0
    }

    private func append(_ to: inout [UInt8], _ at: UnsafePointer<CChar>?, _ n: Int) {
        guard let at, n > 0 else { return }
        to.append(contentsOf: UnsafeRawBufferPointer(start: at, count: n))
    }
}
