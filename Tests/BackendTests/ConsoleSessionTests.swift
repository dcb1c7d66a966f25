import Foundation
import PylonClientKit
import TestSupport
import Testing

/// The console's access layer (issue 33): operator accounts, sessions (cookie, CSRF, idle
/// expiry, login rate limit), roles, the audit log, the console's files and their headers,
/// `--enable-reset`, `/metrics`.
@Suite(.serialized) struct ConsoleSessionTests {
    static let adminPassword = "admin-password-0123"
    static let viewerPassword = "viewer-password-0123"

    /// A backend with an admin `ada` and a viewer `vic` (created with the operator token).
    static func backend(_ extra: [String] = [], store: StoreKind = .sqlite) throws -> BackendProcess {
        let b = try BackendProcess(extra, store: store)
        for (name, role, pw) in [("ada", "admin", adminPassword), ("vic", "viewer", viewerPassword)] {
            let r = try b.request(
                "POST", "/v1/admin/operators",
                body: Array(JSON.object(["name": .string(name), "role": .string(role), "password": .string(pw)]).serialized.utf8))
            guard r.status == 201 else { throw TestFailure(description: "create \(name): \(r.status) \(r.text)") }
        }
        return b
    }

    /// A logged-in session: its cookie header and CSRF token.
    struct Session {
        var cookie: String
        var csrf: String
        var headers: [(String, String)] { [("Authorization", ""), ("Cookie", cookie)] }
        var changeHeaders: [(String, String)] { headers + [("X-CSRF-Token", csrf)] }
    }

    static func login(_ b: BackendProcess, _ body: JSON) throws -> (HTTPReply, Session?) {
        let r = try b.request(
            "POST", "/v1/session/login", headers: [("Authorization", ""), ("Content-Type", "application/json")],
            body: Array(body.serialized.utf8))
        guard r.status == 200, let set = r.headers["set-cookie"], let csrf = try r.json()["csrfToken"]?.stringValue else { return (r, nil) }
        return (r, Session(cookie: String(set.split(separator: ";")[0]), csrf: csrf))
    }

    static func login(_ b: BackendProcess, _ name: String, _ password: String) throws -> Session {
        let (r, s) = try login(b, ["name": .string(name), "password": .string(password)])
        guard let s else { throw TestFailure(description: "login \(name): \(r.status) \(r.text)") }
        return s
    }

    static func json(_ j: JSON) -> [UInt8] { Array(j.serialized.utf8) }

    @Test(arguments: StoreKind.allCases) func loginSessionAndLogout(_ store: StoreKind) throws {
        let b = try ConsoleSessionTests.backend(store: store)
        let (r, s) = try ConsoleSessionTests.login(b, ["name": "ada", "password": .string(ConsoleSessionTests.adminPassword)])
        let session = try #require(s)
        #expect(try r.json()["name"] == "ada")
        #expect(try r.json()["role"] == "admin")
        let cookie = try #require(r.headers["set-cookie"])
        for attr in ["HttpOnly", "SameSite=Strict", "Path=/"] { #expect(cookie.contains(attr), "\(cookie)") }
        #expect(!cookie.contains("Secure"))
        // The cookie reads the session and the operator API.
        let info = try b.request("GET", "/v1/session", headers: session.headers)
        #expect(info.status == 200)
        #expect(try info.json()["csrfToken"]?.stringValue == session.csrf)
        #expect(try b.request("GET", "/v1/admin/operators", headers: session.headers).status == 200)
        // Logout needs the CSRF token, then ends the session server-side.
        #expect(try b.request("POST", "/v1/session/logout", headers: session.headers).status == 403)
        let out = try b.request("POST", "/v1/session/logout", headers: session.changeHeaders)
        #expect(out.status == 204)
        #expect(out.headers["set-cookie"]?.contains("Max-Age=0") == true)
        #expect(out.headers["content-length"] == nil && out.body.isEmpty)  // RFC 9110: a 204 has neither
        let after = try b.request("GET", "/v1/session", headers: session.headers)
        #expect(after.status == 401)
        #expect(try after.json()["code"] == "no_session")
        #expect(try b.request("GET", "/v1/admin/operators", headers: session.headers).status == 401)
        // Wrong password, unknown name: the same 401.
        for (n, p) in [("ada", "wrong-password-0123"), ("nobody", "wrong-password-0123")] {
            let (bad, none) = try ConsoleSessionTests.login(b, ["name": .string(n), "password": .string(p)])
            #expect(none == nil)
            #expect(bad.status == 401)
            #expect(try bad.json()["code"] == "bad_credentials")
        }
        // The operator token logs in as the admin "operator"; a wrong one does not.
        let (tok, ts) = try ConsoleSessionTests.login(b, ["token": .string(TestCredentials.operatorToken)])
        #expect(ts != nil)
        #expect(try tok.json()["name"] == "operator")
        #expect(try ConsoleSessionTests.login(b, ["token": "not-the-token-0123456789"]).0.status == 401)
        // A login a cross-site form could send (no JSON content type) is refused.
        let form = try b.request(
            "POST", "/v1/session/login", headers: [("Authorization", ""), ("Content-Type", "text/plain")],
            body: ConsoleSessionTests.json(["name": "ada", "password": .string(ConsoleSessionTests.adminPassword)]))
        #expect(form.status == 400)
        #expect(form.headers["set-cookie"] == nil)
        // Account changes and the failed logins are in the audit log, newest first.
        let audit = try b.get("/v1/admin/audit?action=operator.create")["items"]?.arrayValue ?? []
        #expect(audit.compactMap { $0["target"]?.stringValue } == ["vic", "ada"])
        #expect(audit.allSatisfy { $0["actor"] == "operator" })
        let failed = try b.get("/v1/admin/audit?action=session.login_failed")["items"]?.arrayValue ?? []
        #expect(failed.count == 3)
    }

    @Test func aCookieChangeNeedsTheCSRFToken() throws {
        let b = try ConsoleSessionTests.backend()
        let s = try ConsoleSessionTests.login(b, "ada", ConsoleSessionTests.adminPassword)
        let body = ConsoleSessionTests.json(["name": "eve", "role": "viewer", "password": "eve-password-0123"])
        for headers in [s.headers, s.headers + [("X-CSRF-Token", String(repeating: "0", count: 32))]] {
            let r = try b.request("POST", "/v1/admin/operators", headers: headers, body: body)
            #expect(r.status == 403)
            #expect(try r.json()["code"] == "csrf_required")
        }
        #expect(try b.get("/v1/admin/operators")["items"]?.arrayValue?.count == 2)
        let ok = try b.request("POST", "/v1/admin/operators", headers: s.changeHeaders, body: body)
        #expect(ok.status == 201)
        // Audited under the session's name.
        let last = try b.get("/v1/admin/audit?limit=1")["items"]?.arrayValue?.first
        #expect(last?["actor"] == "ada")
        #expect(last?["action"] == "operator.create")
        #expect(last?["target"] == "eve")
        // The bearer token needs no CSRF token (no cookie).
        #expect(try b.request("DELETE", "/v1/admin/operators/eve").status == 204)
    }

    @Test func aViewerReadsButCannotChange() throws {
        let b = try ConsoleSessionTests.backend()
        let v = try ConsoleSessionTests.login(b, "vic", ConsoleSessionTests.viewerPassword)
        for path in ["/v1/admin/operators", "/v1/admin/audit", "/v1/admin/dashboard", "/v1/admin/devices", "/v1/inspect/stats"] {
            #expect(try b.request("GET", path, headers: v.headers).status == 200, "\(path)")
        }
        let changes: [(String, String, JSON)] = [
            ("POST", "/v1/admin/push/send", ["appId": "a", "targetType": "device", "target": "t", "title": "x"]),
            ("POST", "/v1/admin/operators", ["name": "eve", "role": "admin", "password": "eve-password-0123"]),
            ("PATCH", "/v1/admin/operators/vic", ["role": "admin"]),
            ("POST", "/v1/admin/gtm/containers/c1/rollback", ["version": 1]),
            ("POST", "/v1/admin/gtm/containers/c1/versions", ["container": ["resource": [:]]]),
        ]
        for (m, path, body) in changes {
            let r = try b.request(m, path, headers: v.changeHeaders, body: ConsoleSessionTests.json(body))
            #expect(r.status == 403, "\(m) \(path)")
            #expect(try r.json()["code"] == "forbidden")
            #expect(try r.json()["reason"] == "admin_only")
        }
        #expect(try b.get("/v1/admin/operators")["items"]?.arrayValue?.last?["role"] == "viewer")
        #expect(try b.request("GET", "/v1/inspect/gtm/containers/c1").json()["versions"] == [])
        // An admin makes the viewer an admin: the open session has the new role at once.
        let a = try ConsoleSessionTests.login(b, "ada", ConsoleSessionTests.adminPassword)
        let up = try b.request(
            "PATCH", "/v1/admin/operators/vic", headers: a.changeHeaders, body: ConsoleSessionTests.json(["role": "admin"]))
        #expect(up.status == 200)
        let r = try b.request(
            "POST", "/v1/admin/gtm/containers/c1/versions", headers: v.changeHeaders,
            body: ConsoleSessionTests.json(["container": ["resource": [:]]]))
        #expect(r.status == 200)
        // A new password ends the account's sessions.
        let pw = try b.request(
            "PATCH", "/v1/admin/operators/vic", headers: a.changeHeaders,
            body: ConsoleSessionTests.json(["password": "another-password-0123"]))
        #expect(pw.status == 200)
        #expect(try b.request("GET", "/v1/session", headers: v.headers).status == 401)
        _ = try ConsoleSessionTests.login(b, "vic", "another-password-0123")
    }

    @Test func anIdleSessionExpires() throws {
        let b = try ConsoleSessionTests.backend(["--session-idle-ms", "400"])
        let s = try ConsoleSessionTests.login(b, "ada", ConsoleSessionTests.adminPassword)
        #expect(try b.request("GET", "/v1/session", headers: s.headers).json()["idleTimeoutMs"] == 400)
        // Unused for longer than the idle limit (every request would renew it, so the wait
        // polls the clock, not the backend), it has ended, and stays ended.
        let unused = Date().addingTimeInterval(0.5)
        try waitUntil(timeout: 10) { Date() > unused }
        #expect(try b.request("GET", "/v1/admin/operators", headers: s.headers).status == 401)
        #expect(try b.request("GET", "/v1/session", headers: s.headers).status == 401)
        // The absolute limit ends a session in use too.
        let c = try ConsoleSessionTests.backend(["--session-max-ms", "600"])
        let t = try ConsoleSessionTests.login(c, "ada", ConsoleSessionTests.adminPassword)
        try waitUntil(timeout: 10) { try c.request("GET", "/v1/session", headers: t.headers).status == 401 }
    }

    @Test func failedLoginsAreRateLimited() throws {
        let b = try ConsoleSessionTests.backend()
        for _ in 0..<5 {
            let (r, _) = try ConsoleSessionTests.login(b, ["name": "ada", "password": "wrong-password-0123"])
            #expect(r.status == 401)
        }
        // The sixth attempt is refused before any check, the right password too.
        let (r, s) = try ConsoleSessionTests.login(b, ["name": "ada", "password": .string(ConsoleSessionTests.adminPassword)])
        #expect(s == nil)
        #expect(r.status == 429)
        #expect(try r.json()["code"] == "rate_limited")
        let wait = try #require(try r.json()["retryAfterMs"]?.intValue)
        #expect(wait > 0 && wait <= 60_000)
        #expect(r.headers["retry-after"] != nil)
        // Another name from the same address still logs in (the address limit is higher).
        _ = try ConsoleSessionTests.login(b, "vic", ConsoleSessionTests.viewerPassword)
    }

    @Test func withoutATokenOrAccountsTheOperatorAPIStaysClosed() throws {
        let b = try BackendProcess(auth: false)
        for path in ["/v1/admin/operators", "/v1/admin/dashboard", "/metrics"] {
            #expect(try b.request("GET", path).status == 403, "\(path)")
        }
        let (r, _) = try ConsoleSessionTests.login(b, ["token": "anything-0123456789abcdef"])
        #expect(r.status == 401)
        #expect(
            try b.request(
                "GET", "/v1/admin/operators",
                headers: [("Authorization", ""), ("Cookie", "pylon_session=" + String(repeating: "ab", count: 32))]
            ).status
                == 401)
    }

    @Test func theCLICreatesAnAccount() throws {
        let dir = NSTemporaryDirectory() + "pylon-console-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let pw = dir + "/pw"
        try "cli-password-0123456789\n".write(toFile: pw, atomically: true, encoding: .utf8)
        chmod(pw, 0o600)
        let db = dir + "/b.sqlite"
        let p = Process()
        p.executableURL = URL(fileURLWithPath: binDir + "/pylon-backend")
        p.arguments = ["--db", db, "--add-operator", "cara", "--role", "admin", "--password-file", pw]
        p.standardError = FileHandle.nullDevice
        try p.run()
        p.waitUntilExit()
        #expect(p.terminationStatus == 0)
        let b = try BackendProcess(database: ["--db", db])
        let s = try ConsoleSessionTests.login(b, "cara", "cli-password-0123456789")
        #expect(try b.request("GET", "/v1/session", headers: s.headers).json()["role"] == "admin")
        #expect(try b.get("/v1/admin/audit")["items"]?.arrayValue?.first?["actor"] == "cli")
    }

    @Test func theConsoleFilesAreServedWithTheirHeaders() throws {
        let dir = NSTemporaryDirectory() + "pylon-console-" + UUID().uuidString.prefix(8)
        let www = dir + "/www"
        try FileManager.default.createDirectory(atPath: www + "/js", withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try "<!doctype html><title>c</title>".write(toFile: www + "/index.html", atomically: true, encoding: .utf8)
        try "export const x = 1;".write(toFile: www + "/js/app.mjs", atomically: true, encoding: .utf8)
        try "secret".write(toFile: dir + "/outside.txt", atomically: true, encoding: .utf8)
        try FileManager.default.createSymbolicLink(atPath: www + "/escape.txt", withDestinationPath: dir + "/outside.txt")
        try FileManager.default.createSymbolicLink(atPath: www + "/passwd", withDestinationPath: "/etc/passwd")
        try "x".write(toFile: www + "/.hidden", atomically: true, encoding: .utf8)
        let b = try BackendProcess(["--console-dir", www])
        let index = try b.request("GET", "/")
        #expect(index.status == 200)
        #expect(index.headers["content-type"] == "text/html; charset=utf-8")
        #expect(index.text.contains("<title>c</title>"))
        for (k, v) in [
            (
                "content-security-policy",
                "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
            ),
            ("x-content-type-options", "nosniff"), ("referrer-policy", "no-referrer"), ("x-frame-options", "DENY"),
            ("cache-control", "no-cache"),
        ] {
            #expect(index.headers[k] == v, "\(k)")
        }
        #expect(try b.request("GET", "/index.html").text == index.text)
        let js = try b.request("GET", "/js/app.mjs")
        #expect(js.headers["content-type"] == "text/javascript; charset=utf-8")
        // The API's answers carry the headers too; a device's do not.
        #expect(try b.request("GET", "/v1/admin/operators").headers["x-frame-options"] == "DENY")
        #expect(try b.request("GET", "/v1/session").headers["content-security-policy"] != nil)
        #expect(try b.postBatch("s", key: "k", batchBody(key: "k", stream: "s", ids: ["a"])).headers["content-security-policy"] == nil)
        // No traversal, no symlink out of the directory, no hidden file, no listing.
        for target in [
            "/../outside.txt", "/%2e%2e/outside.txt", "/js/../../outside.txt", "/js/%2e%2e%2f%2e%2e%2foutside.txt", "/escape.txt",
            "/passwd",
            "/.hidden", "/js", "/js/", "/nope.html", "/..",
        ] {
            let r = try b.request("GET", target)
            #expect(r.status == 404 || r.status == 400, "\(target): \(r.status)")
            #expect(!r.text.contains("secret") && !r.text.contains("root:"), "\(target)")
        }
        // GET and HEAD only.
        let head = try b.client()
        try head.send(RawHTTPClient.message("HEAD", "/"))
        let h = try #require(try head.readResponse(toHEAD: true))
        #expect(h.status == 200)
        #expect(h.body.isEmpty)
        #expect(try b.request("POST", "/", body: Array("{}".utf8)).status == 405)
        // Injected faults never touch sessions or metrics.
        try b.setFaults(["failNext": 1, "status": 500])
        #expect(try b.request("GET", "/v1/session", headers: [("Authorization", "")]).status == 401)
        #expect(try b.request("GET", "/metrics", headers: [("Authorization", "Bearer " + TestCredentials.operatorToken)]).status == 200)
        #expect(try b.postBatch("s", key: "k2", batchBody(key: "k2", stream: "s", ids: ["b"])).status == 500)
        // Without --console-dir there is nothing at /.
        #expect(try BackendProcess().request("GET", "/").status == 404)
    }

    @Test func resetNeedsItsFlag() throws {
        let dir = NSTemporaryDirectory() + "pylon-backend-test-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let b = try BackendProcess(try TestCredentials.arguments(dir, faults: false), dir: dir, auth: false)
        #expect(try b.postBatch("s", key: "k", batchBody(key: "k", stream: "s", ids: ["a"])).status == 200)
        let r = try b.request("POST", "/v1/admin/reset")
        #expect(r.status == 404)
        #expect(try r.json()["code"] == "reset_disabled")
        #expect(try b.get("/v1/inspect/streams/s")["records"] == 1)
        // With the flag (BackendProcess's default arguments) it resets, and is audited.
        let c = try BackendProcess()
        #expect(try c.request("POST", "/v1/admin/reset").status == 200)
        #expect(try c.get("/v1/admin/audit")["items"]?.arrayValue?.first?["action"] == "reset")
        // A publish is audited with its container and version; a refused push send (no broker
        // here: 503) changed nothing and is not audited.
        #expect(try c.request("POST", "/v1/admin/gtm/containers/GTM-A/versions", body: Array(#"{"container":{}}"#.utf8)).status == 200)
        let publish = try c.get("/v1/admin/audit?action=gtm.publish")["items"]?.arrayValue?.first
        #expect(publish?["target"] == "GTM-A")
        #expect(publish?["detail"]?["version"] == "1")
        #expect(try c.request("POST", "/v1/admin/push/send", body: Array(#"{"appId":"a","target":"t","title":"x"}"#.utf8)).status == 503)
        #expect(try c.get("/v1/admin/audit?action=push.send")["items"]?.arrayValue?.isEmpty == true)
    }

    @Test func metricsAreValidPrometheusText() throws {
        let dir = NSTemporaryDirectory() + "pylon-backend-test-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let scrape = dir + "/scrape.token"
        try "scrape-token-0123456789abcdef\n".write(toFile: scrape, atomically: true, encoding: .utf8)
        chmod(scrape, 0o600)
        let b = try BackendProcess(["--metrics-token-file", scrape], dir: dir)
        #expect(try b.postBatch("s", key: "k", batchBody(key: "k", stream: "s", ids: ["a", "b"])).status == 200)
        #expect(try b.postBatch("s", key: "", batchBody(key: "", stream: "s", ids: ["a"])).status == 400)
        _ = try b.request("GET", "/v1/inspect/streams/some/path/that/is/unknown")
        let r = try b.request("GET", "/metrics", headers: [("Authorization", "Bearer " + TestCredentials.operatorToken)])
        #expect(r.status == 200)
        #expect(r.headers["content-type"]?.hasPrefix("text/plain; version=0.0.4") == true)
        let text = r.text
        for line in [
            #"pylon_backend_requests_total{route="ingest",code="2xx"} 1"#, #"pylon_backend_requests_total{route="ingest",code="4xx"} 1"#,
            "pylon_backend_ingest_records_total 2", #"pylon_backend_ingest_batches_total{outcome="refused"} 1"#,
        ] {
            #expect(text.contains(line + "\n"), "\(line) in \(text)")
        }
        // Labels are route classes: no raw path appears.
        #expect(!text.contains("/v1/"))
        // The scrape token reads /metrics and nothing else.
        let scraped = try b.request("GET", "/metrics", headers: [("Authorization", "Bearer scrape-token-0123456789abcdef")])
        #expect(scraped.status == 200)
        #expect(
            try b.request("GET", "/v1/admin/dashboard", headers: [("Authorization", "Bearer scrape-token-0123456789abcdef")]).status == 401)
        #expect(try b.request("GET", "/metrics", headers: [("Authorization", "")]).status == 401)
        guard let promtool = promtoolPath else {
            print("SKIPPED: promtool not installed (Debian package prometheus; make deps installs it)")
            return
        }
        let (status, said) = try promtoolCheck(text, promtool: promtool)
        #expect(status == 0 && said.isEmpty, "promtool: \(said)")
    }
}
