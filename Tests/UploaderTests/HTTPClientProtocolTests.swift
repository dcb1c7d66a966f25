import Foundation
import PylonCore
import PylonHTTP
import Testing

/// The process's one libuv loop (`Loop` wraps `uv_default_loop` and is never freed): one for
/// the whole test process.
nonisolated(unsafe) private let loop = Loop()

/// The HTTP client speaks HTTP(S) only: a URL with another scheme fails before any I/O.
@Suite(.serialized) struct HTTPClientProtocolTests {
    func send(_ url: String, maxResponseBytes: Int = HTTPRequest.defaultMaxResponseBytes) -> Result<HTTPResponse, HTTPClientError>? {
        let client = HTTPClient(loop: loop)
        var result: Result<HTTPResponse, HTTPClientError>?
        let req = HTTPRequest(method: "POST", url: url, body: Array("x".utf8), timeoutMs: 10_000, maxResponseBytes: maxResponseBytes)
        client.send(req) { r in
            result = r
            loop.stop()
        }
        // A guard: a transfer that never completes fails the test instead of hanging it.
        var guardTimer = loop.after(ms: 20_000, unref: true) { loop.stop() }
        loop.run()
        guardTimer.stop()
        client.shutdown()
        guardTimer = loop.after(ms: 5_000, unref: true) { loop.stop() }
        loop.run()
        guardTimer.stop()
        return result
    }

    /// CURLE_UNSUPPORTED_PROTOCOL.
    static let unsupported: Int32 = 1

    @Test(arguments: ["file:///etc/hostname", "gopher://127.0.0.1:9/_raw", "dict://127.0.0.1:9/x", "telnet://127.0.0.1:9"])
    func otherSchemesAreRefused(url: String) throws {
        let r = try #require(send(url))
        guard case .failure(let e) = r else {
            Issue.record("\(url) was fetched")
            return
        }
        #expect(e.code == HTTPClientProtocolTests.unsupported, "\(url): \(e.description)")
    }
}
