import PylonCore
import PylonProtocol
import Testing

@testable import pylon_uploader

/// Who owns a stream, which consent switch it falls under, where its data may go, and how the
/// disk cap is shared: pure decisions, no processes.
struct StreamPolicyTests {
    let ma = Principal(plugin: "ma")
    let app = Principal(uid: 1000)
    let other = Principal(uid: 65534)
    /// Root as the host describes it by default (`disclosure.admins`: uid 0).
    let root = Principal(uid: 0, admin: true)

    @Test func consentKeyIsFixedByNameOrConfig() throws {
        let c = try UploaderConfig(["streams": ["pinned.*": ["consent": "tracking"], "ma.special": ["maxCount": 3]]])
        #expect(c.catalog.consentKey(for: "ma.victim") == "ma:victim")
        #expect(c.catalog.consentKey(for: "push.opens") == "push:opens")
        #expect(c.catalog.consentKey(for: "gtm.hits") == "gtm:hits")
        #expect(c.catalog.consentKey(for: "bench123") == "bench123")
        #expect(c.catalog.consentKey(for: "pinned.x") == "tracking")
        #expect(c.catalog.consentKey(for: "ma.special") == "ma:special", "an entry without consent keeps the derived key")
    }

    /// The opt-out reports' stream is the uploader's, under its own switch, whatever the
    /// configuration or a first writer says: no caller can pin it to a switch that could be
    /// denied, or own it and forge reports.
    @Test func theOptOutStreamIsTheUploadersUnderItsOwnSwitch() throws {
        let c = try UploaderConfig(["streams": ["pylon.*": ["consent": "tracking", "owner": "uid:1000"]]])
        #expect(c.catalog.consentKey(for: "pylon.consent") == OptOutReports.consentKey)
        #expect(c.catalog.owner(of: "pylon.consent", recorded: .uid(65534)) == .plugin("uploader"))
        #expect(c.catalog.consentKey(for: "pylon.other") == "tracking")
        let refused = StreamAccess.decide("pylon.consent", owner: .plugin("uploader"), caller: other, action: "enqueue to", claims: true)
        #expect(refused != .allowed(owner: .plugin("uploader"), claim: false))
    }

    @Test func pluginNamespacesBelongToTheirPlugin() {
        let cat = StreamCatalog()
        #expect(cat.owner(of: "ma.victim", recorded: nil) == .plugin("ma"))
        #expect(cat.owner(of: "ma.victim", recorded: .uid(65534)) == .plugin("ma"), "a recorded first writer never beats the namespace")
        #expect(cat.owner(of: "mine.x", recorded: nil) == nil)
        #expect(cat.owner(of: "mine.x", recorded: .uid(1000)) == .uid(1000))
        let pinned = StreamCatalog(entries: [.init(pattern: "shared.*", owner: .uid(42))], pluginNamespaces: ["ma"])
        #expect(pinned.owner(of: "shared.a", recorded: .uid(1)) == .uid(42))
        #expect(pinned.owner(of: "push.a", recorded: nil) == nil, "namespaces are configurable")
    }

    /// "Admin" is the host's word only: uid 0 without the host's flag (an operator who took
    /// root off `disclosure.admins`) is an ordinary caller.
    @Test func adminComesFromTheHostOnly() {
        #expect(!Principal(uid: 0).isAdmin)
        #expect(Principal(uid: 1000, admin: true).isAdmin)
        let owner = StreamOwner.uid(1000)
        #expect(
            StreamAccess.decide("mine.x", owner: owner, caller: Principal(uid: 0), action: "read", claims: false)
                != .allowed(owner: owner, claim: false))
    }

    @Test func onlyTheOwnerOrAnAdminMayUseAStream() {
        let owner = StreamOwner.plugin("ma")
        guard case .refused(let e) = StreamAccess.decide("ma.victim", owner: owner, caller: other, action: "configure", claims: true) else {
            Issue.record("another uid configured MA's stream")
            return
        }
        #expect(e.code == RPCError.Code.notPermitted.rawValue)
        #expect(e.message.contains("ma.victim") && e.message.contains("plugin:ma"))
        #expect(
            StreamAccess.decide("ma.victim", owner: owner, caller: ma, action: "enqueue to", claims: true)
                == .allowed(owner: owner, claim: false))
        #expect(
            StreamAccess.decide("ma.victim", owner: owner, caller: Principal(plugin: "ma", uid: 1000), action: "x", claims: true)
                == .allowed(owner: owner, claim: false), "a plugin on a client's behalf acts as the plugin")
        #expect(
            StreamAccess.decide("ma.victim", owner: owner, caller: root, action: "x", claims: true) == .allowed(owner: owner, claim: false))
        #expect(
            StreamAccess.decide("ma.victim", owner: owner, caller: Principal(uid: 7, admin: true), action: "x", claims: false)
                == .allowed(owner: owner, claim: false))
        if case .allowed = StreamAccess.decide("ma.victim", owner: owner, caller: Principal(plugin: "push"), action: "x", claims: true) {
            Issue.record("another plugin wrote MA's stream")
        }
        if case .allowed = StreamAccess.decide("ma.victim", owner: owner, caller: Principal(caller: nil), action: "x", claims: true) {
            Issue.record("an anonymous caller wrote MA's stream")
        }
    }

    @Test func theFirstWriterOwnsAnUnownedStream() {
        #expect(
            StreamAccess.decide("mine.x", owner: nil, caller: app, action: "enqueue to", claims: true)
                == .allowed(owner: .uid(1000), claim: true))
        if case .allowed = StreamAccess.decide("mine.x", owner: .uid(1000), caller: other, action: "enqueue to", claims: true) {
            Issue.record("another uid wrote a uid's stream")
        }
        if case .allowed = StreamAccess.decide("mine.x", owner: nil, caller: Principal(caller: nil), action: "enqueue to", claims: true) {
            Issue.record("an anonymous caller claimed a stream")
        }
        if case .allowed = StreamAccess.decide("old.x", owner: nil, caller: app, action: "read", claims: false) {
            Issue.record("a non-admin read a stream nobody owns")
        }
        #expect(StreamAccess.decide("old.x", owner: nil, caller: root, action: "read", claims: false) == .allowed(owner: nil, claim: false))
    }

    @Test func principalFromTheHostsCallerInfo() {
        #expect(Principal(caller: ["plugin": "ma"]) == Principal(plugin: "ma"))
        #expect(Principal(caller: ["client": 3, "uid": 1000, "gid": 1000, "pid": 9]).identity == .uid(1000))
        #expect(Principal(caller: ["client": 3, "uid": 1000, "admin": true]).isAdmin)
        #expect(!Principal(caller: ["client": 3, "uid": 0]).isAdmin, "admin is the host's flag, not the uid")
        #expect(!Principal(caller: ["plugin": "ma"]).isAdmin)
        #expect(Principal(caller: nil).identity == nil)
        #expect(StreamOwner("plugin:ma") == .plugin("ma") && StreamOwner("uid:12") == .uid(12))
        #expect(StreamOwner("uid:x") == nil && StreamOwner("plugin:") == nil && StreamOwner("ma") == nil)
    }

    @Test(arguments: [
        "gopher://127.0.0.1:70/_x", "file:///etc/passwd", "dict://h/", "ftp://h/{stream}", "127.0.0.1:8780/x",
        "http://user:pw@evil.example/x", "http://allowed.example@evil.example/x", "http://{stream}.evil/x", "http:///x",
        "http://h/a b",
    ])
    func endpointsMustBeHTTP(url: String) {
        if case .success = EndpointRule.check(url, allowedHosts: nil) { Issue.record("\(url) accepted") }
        #expect(throws: UploaderConfigError.self) { try UploaderConfig(["endpoint": .string(url)]) }
    }

    @Test func endpointHostsAndAllowList() throws {
        #expect(try EndpointRule.check("http://127.0.0.1:8780/v1/batches/{stream}", allowedHosts: nil).get() == "127.0.0.1")
        #expect(try EndpointRule.check("HTTPS://Ingest.Example.com/x", allowedHosts: nil).get() == "ingest.example.com")
        #expect(try EndpointRule.check("http://[::1]:80/x", allowedHosts: ["::1"]).get() == "::1")
        if case .success = EndpointRule.check("http://evil.example/x", allowedHosts: ["ingest.example.com"]) {
            Issue.record("host outside allowedHosts")
        }
        #expect(throws: UploaderConfigError.self) {
            try UploaderConfig([
                "endpoint": "https://ingest.example.com/{stream}", "allowedHosts": ["ingest.example.com"],
                "streams": ["x.*": ["endpoint": "http://127.0.0.1:1/x"]],
            ])
        }
        _ = try UploaderConfig(["endpoint": "https://ingest.example.com/{stream}", "allowedHosts": ["Ingest.Example.com"]])
    }

    @Test func invalidOwnersAndConsentInConfigAreRefused() {
        #expect(throws: UploaderConfigError.self) { try UploaderConfig(["streams": ["a.*": ["owner": "root"]]]) }
        #expect(throws: UploaderConfigError.self) { try UploaderConfig(["streams": ["a.*": ["consent": 1]]]) }
        #expect(throws: UploaderConfigError.self) { try UploaderConfig(["maxDiskBytesPerOwner": -1]) }
    }

    @Test func oneOwnerOverItsShareDoesNotStarveTheOthers() throws {
        let limits = try UploaderConfig(["maxDiskBytes": 4000]).limits
        #expect(limits.maxDiskBytesPerOwner == 1000, "default share: a quarter of the cap")
        var l = OwnerLedger()
        let junk = StreamOwner.uid(65534)
        l.addStream(junk)
        l.add(junk, 900)
        l.reserve(junk, 50)
        let e = try #require(l.admit(junk, bytes: 100, newStream: false, totalBytes: 950, limits: limits))
        #expect(e.code == RPCError.Code.overloaded.rawValue)
        #expect(e.message.contains("maxDiskBytesPerOwner") && e.data?["limit"] == "maxDiskBytesPerOwner")
        #expect(l.admit(junk, bytes: 50, newStream: false, totalBytes: 950, limits: limits) == nil)
        #expect(l.admit(.plugin("ma"), bytes: 1000, newStream: true, totalBytes: 950, limits: limits) == nil, "others keep working")
        #expect(l.admit(.plugin("ma"), bytes: 1000, newStream: true, totalBytes: 3500, limits: limits)?.data?["limit"] == "maxDiskBytes")
        l.committed(junk, reserved: 50, stored: 50)
        l.remove(junk, 950)
        #expect(l.usage(junk).bytes == 0)
    }

    @Test func streamsPerOwnerAreBounded() throws {
        let limits = try UploaderConfig(["maxStreamsPerOwner": 2, "owners": ["plugin:ma": ["maxStreams": 5, "maxDiskBytes": 1_048_576]]])
            .limits
        var l = OwnerLedger()
        let u = StreamOwner.uid(65534)
        l.addStream(u)
        l.addStream(u)
        let e = try #require(l.admit(u, bytes: 1, newStream: true, totalBytes: 0, limits: limits))
        #expect(e.code == RPCError.Code.overloaded.rawValue && e.data?["limit"] == "maxStreamsPerOwner")
        #expect(l.admit(u, bytes: 1, newStream: false, totalBytes: 0, limits: limits) == nil, "its existing streams keep working")
        let ma = StreamOwner.plugin("ma")
        #expect(limits.streams(for: ma) == 5 && limits.diskBytes(for: ma) == 1_048_576)
    }

    /// Issue 21 item 17: every numeric setting has named bounds and a value outside them is a
    /// configuration error naming the key and the bounds, not a silent clamp (a stream's
    /// `maxBatchBytes` of 1e15 was accepted; `maxCount` 0 became 1).
    @Test func numericSettingsOutsideTheirBoundsAreConfigurationErrors() throws {
        let bad: [(JSON, String)] = [
            (["streams": ["s.*": ["maxBatchBytes": 1e15]]], "streams[s.*].maxBatchBytes must be an integer from 1024 to 8388608"),
            (["streams": ["s.*": ["maxBatchBytes": 1000]]], "streams[s.*].maxBatchBytes must be an integer from 1024"),
            (["streams": ["s.*": ["maxCount": 0]]], "streams[s.*].maxCount must be an integer from 1 to 500"),
            (["streams": ["s.*": ["maxCount": 501]]], "streams[s.*].maxCount must be an integer from 1 to 500"),
            (["streams": ["s.*": ["intervalMs": -1]]], "streams[s.*].intervalMs must be an integer from 0 to 86400000"),
            (["streams": ["s.*": ["intervalMs": "10"]]], "streams[s.*].intervalMs must be an integer"),
            (["streams": ["s.*": 5]], "streams[s.*] must be an object"),
            (["maxDiskBytes": 1e13], "maxDiskBytes must be an integer from 1 to 1099511627776"),
            (["maxDiskBytes": 1000, "maxDiskBytesPerOwner": 2000], "maxDiskBytesPerOwner (2000) must not exceed maxDiskBytes (1000)"),
            (["maxStreamsPerOwner": 100_000], "maxStreamsPerOwner must be an integer from 1 to 65536"),
            (["requestTimeoutMs": 0], "requestTimeoutMs must be an integer from 1 to 600000"),
            (["retryInitialMs": 3_600_001], "retryInitialMs must be an integer from 0 to 3600000"),
            (["retryMaxMs": 1e12], "retryMaxMs must be an integer from 0 to 86400000"),
            (["retryInitialMs": 5000, "retryMaxMs": 100], "retryMaxMs (100) must be at least retryInitialMs (5000)"),
            (["maxRetryAfterMs": -5], "maxRetryAfterMs must be an integer from 0 to 86400000"),
            (["owners": ["uid:5": ["maxDiskBytes": -1]]], "owners[uid:5].maxDiskBytes must be an integer from 0"),
            (["owners": ["uid:5": ["maxStreams": 1.5]]], "owners[uid:5].maxStreams must be an integer from 0 to 65536"),
        ]
        for (config, message) in bad {
            do {
                _ = try UploaderConfig(config)
                Issue.record("accepted \(config.serialized)")
            } catch {
                #expect(error.description.hasPrefix(message), "\(config.serialized): \(error.description)")
            }
        }
        // The bounds themselves are accepted.
        let ok = try UploaderConfig([
            "streams": ["s.*": ["maxBatchBytes": 8_388_608, "maxCount": 500, "intervalMs": 86_400_000]], "maxDiskBytes": 1_099_511_627_776,
            "retryMaxMs": 86_400_000, "owners": ["uid:5": ["maxDiskBytes": 0, "maxStreams": 0]],
        ])
        #expect(ok.catalog.settings(for: "s.x", defaultEndpoint: ok.defaultEndpoint).maxBatchBytes == 8 << 20)
    }

    /// `"delivery": "get"` streams (GTM's `_img` pixels, issue 22 item 2): hosts from the entry,
    /// else the plugin's `allowedHosts`, else a configuration error; a batch is one record; a
    /// 3xx answer to the GET is a delivery; a record's URL must be http/https to an allowed host.
    @Test func getStreamsNeedAllowedHostsAndSendOneRecordPerRequest() throws {
        // The top-level list covers the default endpoint's port (8780): a bare host is port 80 only.
        let c = try UploaderConfig([
            "allowedHosts": ["127.0.0.1", "127.0.0.1:8780"],
            "streams": ["gtm.pixels": ["delivery": "get", "allowedHosts": ["Pixel.Example.com"]], "p2": ["delivery": "get"]],
        ])
        let s = c.catalog.settings(for: "gtm.pixels", defaultEndpoint: c.defaultEndpoint)
        #expect(s.getHosts == ["pixel.example.com"])
        #expect(c.catalog.settings(for: "p2", defaultEndpoint: c.defaultEndpoint).getHosts == ["127.0.0.1", "127.0.0.1:8780"])
        #expect(c.catalog.settings(for: "ma.x", defaultEndpoint: c.defaultEndpoint).getHosts == nil)
        var st = StreamState(settings: s)
        st.committed(added: 3, bytes: 30, now: 0)
        st.flush()
        #expect(st.poll(now: 0) == .cut(maxCount: 1, maxBytes: s.maxBatchBytes))
        for bad: JSON in [
            ["streams": ["p": ["delivery": "get"]]], ["streams": ["p": ["delivery": "get", "allowedHosts": []]]],
            ["streams": ["p": ["delivery": "put", "allowedHosts": ["h"]]]], ["streams": ["p": ["allowedHosts": ["h"]]]],
        ] {
            #expect(throws: UploaderConfigError.self, "\(bad.serialized)") { try UploaderConfig(bad) }
        }
        #expect(UploadOutcome.classifyGet(status: 302, retryAfterMs: nil, error: nil) == .delivered)
        #expect(UploadOutcome.classifyGet(status: 204, retryAfterMs: nil, error: nil) == .delivered)
        #expect(UploadOutcome.classifyGet(status: 404, retryAfterMs: nil, error: nil) == .rejected(status: 404, reason: "HTTP 404"))
        #expect(UploadOutcome.classifyGet(status: 503, retryAfterMs: nil, error: nil) == .retry(reason: "HTTP 503", retryAfterMs: nil))
    }

    /// A redirect is not followed (the operator's endpoint is where data may go), nor does it
    /// set the batch aside: it is retried (a proxy in front of the endpoint, issue 21 item 8).
    @Test func redirectsAreNotFollowed() {
        #expect(
            UploadOutcome.classify(status: 302, retryAfterMs: nil, error: nil)
                == .retry(reason: "HTTP 302 (redirects are not followed)", retryAfterMs: nil))
    }
}
