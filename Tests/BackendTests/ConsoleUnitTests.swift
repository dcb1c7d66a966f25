import Foundation
import PylonCore
import TestSupport
import Testing

@testable import PylonBackend

/// The console's pure parts: the login limiter, password hashes, cookies, the console's file
/// table, routing, metrics text, day names. No process, no database (`make test-unit`).
struct ConsoleUnitTests {
    @Test func theLimiterRefusesAfterFiveFailuresPerNameUntilTheWindowMoves() {
        var l = LoginLimiter()
        let keys = LoginLimiter.keys(address: "10.0.0.1", name: "ada")
        for t in 0..<5 {
            #expect(l.retryAfter(keys, now: Int64(t) * 1000) == nil)
            l.fail(keys, now: Int64(t) * 1000)
        }
        // Refused until the oldest failure (t=0) leaves the one-minute window.
        #expect(l.retryAfter(keys, now: 5000) == 55_000)
        #expect(l.retryAfter(keys, now: 59_999) == 1)
        #expect(l.retryAfter(keys, now: 60_000) == nil)
        // Another name from the same address is not refused by five; twenty are.
        let other = LoginLimiter.keys(address: "10.0.0.1", name: "bob")
        #expect(l.retryAfter(other, now: 5000) == nil)
        for t in 0..<16 { l.fail(LoginLimiter.keys(address: "10.0.0.1", name: "n\(t)"), now: 6000) }  // 4 left in the window + 16
        #expect(l.retryAfter(other, now: 7000) != nil)
        // A success clears the name only.
        l.succeed(name: "ada")
        #expect(l.failures["n:ada"] == nil)
    }

    @Test func theLimiterTableIsBounded() {
        var l = LoginLimiter()
        l.maxKeys = 100
        for i in 0..<1000 { l.fail(LoginLimiter.keys(address: "a\(i)", name: String(repeating: "x", count: 5000) + "\(i)"), now: Int64(i)) }
        #expect(l.failures.count <= 100)
        #expect(l.failures.keys.allSatisfy { $0.utf8.count <= 2 + SessionLimits.maxNameBytes })
    }

    @Test func aPasswordHashVerifiesOnlyItsPassword() throws {
        // Small parameters: the format and the check, not the cost.
        let h = try #require(PasswordHash.make(Array("correct horse".utf8), .init(n: 1 << 10, r: 8, p: 1)))
        #expect(h.hasPrefix("scrypt$1024$8$1$"))
        #expect(PasswordHash.verify(Array("correct horse".utf8), h))
        #expect(!PasswordHash.verify(Array("correct horsf".utf8), h))
        #expect(!PasswordHash.verify([], h))
        // Two hashes of one password differ (salt); both verify.
        let h2 = try #require(PasswordHash.make(Array("correct horse".utf8), .init(n: 1 << 10, r: 8, p: 1)))
        #expect(h != h2)
        #expect(PasswordHash.verify(Array("correct horse".utf8), h2))
        // Hostile stored values are refused, never run: huge N, not a power of two, garbage.
        for bad in ["scrypt$1073741824$8$1$AAAA$AAAA", "scrypt$1000$8$1$AAAA$AAAA", "scrypt$1024$8$1$!!$AAAA", "", "bcrypt$x"] {
            #expect(!PasswordHash.verify(Array("x".utf8), bad), "\(bad)")
        }
    }

    @Test func base64RoundTrips() {
        for n in 0..<40 {
            let d = (0..<n).map { UInt8(($0 * 37 + n) & 0xFF) }
            #expect(Base64.decode(Base64.encode(d)[...]) == d)
        }
        #expect(Base64.encode(Array("foob".utf8)) == "Zm9vYg==")
        #expect(Base64.decode("Zm9v=Yg") == nil)
    }

    @Test func theSessionCookieIsReadOnlyWhenWellFormed() {
        let id = String(repeating: "ab", count: 32)
        #expect(SessionCookie.value("a=b; pylon_session=\(id); c=d") == id)
        #expect(SessionCookie.value("pylon_session=\(id.dropLast())") == nil)
        #expect(SessionCookie.value("pylon_session=" + String(repeating: "zz", count: 32)) == nil)
        #expect(SessionCookie.value("other=\(id)") == nil)
        #expect(SessionCookie.value(nil) == nil)
        var s = SessionSettings()
        s.cookieSecure = true
        #expect(s.setCookie(id) == "pylon_session=\(id); Path=/; HttpOnly; SameSite=Strict; Max-Age=43200; Secure")
    }

    @Test func consolePathsNameOnlyLoadedFiles() throws {
        let dir = NSTemporaryDirectory() + "pylon-static-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir + "/www/sub", withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try "i".write(toFile: dir + "/www/index.html", atomically: true, encoding: .utf8)
        try "s".write(toFile: dir + "/www/sub/index.html", atomically: true, encoding: .utf8)
        try "o".write(toFile: dir + "/out.css", atomically: true, encoding: .utf8)
        try FileManager.default.createSymbolicLink(atPath: dir + "/www/out.css", withDestinationPath: dir + "/out.css")
        try FileManager.default.createSymbolicLink(atPath: dir + "/www/in.html", withDestinationPath: dir + "/www/index.html")
        let f = try StaticFiles.load(dir + "/www").get()
        #expect(f.count == 3)
        #expect(f.lookup("")?.bytes == Array("i".utf8))
        #expect(f.lookup("in.html")?.bytes == Array("i".utf8))
        #expect(f.lookup("sub")?.bytes == Array("s".utf8))
        #expect(f.lookup("sub/")?.bytes == Array("s".utf8))
        for p in ["out.css", "../out.css", "sub/../index.html", "./index.html", "sub//index.html", "nope"] {
            #expect(f.lookup(p) == nil, "\(p)")
        }
        #expect(StaticFiles.contentType("a.mjs") == "text/javascript; charset=utf-8")
        #expect(StaticFiles.contentType("a.SVG") == "image/svg+xml")
        #expect(StaticFiles.contentType("a") == "application/octet-stream")
    }

    @Test func routes() {
        #expect(Router.match(method: "GET", path: "/") == .endpoint(.console(.file(path: ""))))
        #expect(Router.match(method: "GET", path: "/js/a.js") == .endpoint(.console(.file(path: "js/a.js"))))
        #expect(Router.match(method: "POST", path: "/v1/session/login") == .endpoint(.console(.login)))
        #expect(Router.match(method: "GET", path: "/v1/session/login") == .methodNotAllowed(allowed: ["POST"]))
        #expect(Router.match(method: "GET", path: "/metrics") == .endpoint(.console(.metrics)))
        #expect(Router.match(method: "PATCH", path: "/v1/admin/operators/a.b") == .endpoint(.console(.updateOperator(name: "a.b"))))
        #expect(
            Router.match(method: "PATCH", path: "/v1/admin/operators/a%20b")
                == .badParameter("operator name must be \(Router.operatorNameRule)"))
        #expect(
            Router.match(method: "GET", path: "/v1/admin/gtm/containers/c/versions") == .endpoint(.console(.containerVersions(id: "c"))))
        #expect(Router.match(method: "POST", path: "/v1/admin/gtm/containers/c/versions") == .endpoint(.gtmPublish(id: "c")))
        #expect(
            Router.match(method: "GET", path: "/v1/admin/gtm/containers/c/versions/0")
                == .badParameter("version must be a positive integer"))
        #expect(Router.match(method: "GET", path: "/healthz") == .endpoint(.health))
        #expect(Router.isFaultExempt("/metrics") && Router.isFaultExempt("/v1/session/login"))
        #expect(!Router.isFaultExempt("/v1/batches/s") && !Router.isFaultExempt("/index.html"))
    }

    @Test func metricsTextIsEscapedAndRouteClassesAreBounded() {
        var m = PylonBackend.MetricsText()
        m.family("x_total", .counter, "h", [([("l", "a\"b\\c\nd")], 1.5)])
        #expect(m.text == "# HELP x_total h\n# TYPE x_total counter\nx_total{l=\"a\\\"b\\\\c\\nd\"} 1.5\n")
        for p in [
            "/v1/batches/x", "/v1/admin/anything/at/all", "/v1/nope", "/a/b/c", "/metrics", "/v1/session/login", "/v1/gtm/containers/c",
        ] {
            #expect(MetricsCounters.routes.indices.contains(MetricsCounters.route(p[...])))
        }
        #expect(MetricsCounters.routes[MetricsCounters.route("/v1/gtm/containers/c")] == "device")
        #expect(MetricsCounters.routes[MetricsCounters.route("/index.html")] == "console")
    }

    @Test func dayNames() {
        #expect(Backend.isoDay(0) == "1970-01-01")
        #expect(Backend.isoDay(19_723) == "2024-01-01")
        #expect(Backend.isoDay(20_789) == "2026-12-02")
        #expect(Backend.isoDay(11_016) == "2000-02-29")
    }
}
