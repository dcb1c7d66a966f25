import PylonCore
import Testing

@testable import PylonTagEngine

@Suite struct DataLayerTests {
    @Test func pushesDeepMerge() {
        var d = DataLayer()
        d.push(["user": ["name": "Ann", "prefs": ["a": 1]]])
        d.push(["user": ["prefs": ["b": 2]]])
        #expect(d.get("user") == ["name": "Ann", "prefs": ["a": 1, "b": 2]])
        #expect(d.get("user.prefs.b") == 2)
        #expect(d.get("user.nope") == nil)
        #expect(d.get("user.name.x") == nil)
    }

    @Test func dottedKeysExpand() {
        var d = DataLayer()
        d.push(["a.b.c": 1, "a.b.d": 2])
        #expect(d.root["a"] == ["b": ["c": 1, "d": 2]])
        #expect(d.get("a.b.c") == 1)
    }

    /// Each part of a dotted key is a level of nesting: past `maxKeyParts` the key is kept as
    /// written (100,000 parts, pushed twice, crashed the plugin in the recursive merge).
    @Test func aKeyWithTooManyPartsIsNotExpanded() {
        var d = DataLayer()
        let deep = Array(repeating: "a", count: 100_000).joined(separator: ".")
        d.push([deep: 1])
        d.push([deep: 2])
        #expect(d.root[deep] == 2 && d.root.count == 1)
        let most = Array(repeating: "b", count: DataLayer.maxKeyParts).joined(separator: ".")
        d.push([most: 3])
        #expect(d.get(most) == 3 && d.root[most] == nil, "\(DataLayer.maxKeyParts) parts still expand")
    }

    @Test func listsMergeIndexByIndex() {
        var d = DataLayer()
        d.push(["l": [1, ["x": 1], 3]])
        d.push(["l": [9, ["y": 2]]])
        #expect(d.get("l") == [9, ["x": 1, "y": 2], 3])
        d.push(["l": [0, 0, 0, 4]])
        #expect(d.get("l") == [0, 0, 0, 4], "the target grows")
    }

    @Test func nullScalarsAndMismatchesOverwrite() {
        var d = DataLayer()
        d.push(["a": ["b": 1], "s": "x", "n": 1])
        d.push(["a": .null, "s": ["now": "map"], "n": "str"])
        #expect(d.root["a"] == .null)
        #expect(d.get("s") == ["now": "map"])
        #expect(d.get("n") == "str")
    }

    @Test func lifetimeParsing() {
        #expect(DataLayer.lifetimeMs("1500") == 1500)
        #expect(DataLayer.lifetimeMs(1500) == 1500)
        #expect(DataLayer.lifetimeMs("10s") == 10_000)
        #expect(DataLayer.lifetimeMs("10 m") == 600_000)
        #expect(DataLayer.lifetimeMs("2h") == 7_200_000)
        #expect(DataLayer.lifetimeMs("1d") == 86_400_000)
        #expect(DataLayer.lifetimeMs("0s") == nil)
        #expect(DataLayer.lifetimeMs("5w") == nil)
        #expect(DataLayer.lifetimeMs("abc") == nil)
        #expect(DataLayer.lifetimeMs(nil) == nil)
    }

    @Test func flattenForPersistence() {
        let f = DataLayer.flatten(["a": ["b": 1, "c": ["d": "x"]], "e": [1, 2]])
        #expect(f.map(\.0) == ["a.b", "a.c.d", "e"])
    }

    @Test func pushQueueDetectsLoops() {
        var q = PushQueue<JSONObject>(limit: 3)
        #expect(q.enqueue(["a": 1]) == .accepted)
        #expect(q.next() == ["a": 1])
        #expect(q.busy)
        for _ in 0..<3 { #expect(q.enqueue(["b": 1]) == .accepted) }
        #expect(q.enqueue(["c": 1]) == .loopDetected)
        #expect(q.items.isEmpty)
        #expect(q.next() == nil)
        #expect(!q.busy)
    }
}

@Suite struct RefreshTests {
    @Test func scheduleAfterSuccessFailureAndAdoption() {
        let h: Int64 = 3_600_000
        #expect(RefreshTiming.nextLoadDelayMs(after: .networkSuccess, nowMs: 0) == 12 * h)
        #expect(RefreshTiming.nextLoadDelayMs(after: .networkFailure, nowMs: 0) == h)
        #expect(RefreshTiming.nextLoadDelayMs(after: .adoptedSaved(savedAtMs: 100 * h), nowMs: 105 * h) == 7 * h)
        #expect(RefreshTiming.nextLoadDelayMs(after: .adoptedSaved(savedAtMs: 100 * h), nowMs: 120 * h) == 0)
        #expect(
            RefreshTiming.nextLoadDelayMs(after: .adoptedSaved(savedAtMs: 100 * h), nowMs: 90 * h) == 12 * h, "clock skew: at most 12 h")
        #expect(RefreshTiming.isStale(fetchedAtMs: 0, nowMs: 12 * h))
        #expect(!RefreshTiming.isStale(fetchedAtMs: 0, nowMs: 12 * h - 1))
    }

    @Test func manualRefreshBucketAndSpacing() {
        var r = RefreshRateLimiter()
        var t: Int64 = 1_000_000
        #expect(r.request(nowMs: t) == .accepted)
        #expect(r.request(nowMs: t + 4_999) == .tooSoon(retryInMs: 1))
        for _ in 0..<29 {
            t += 5_000
            #expect(r.request(nowMs: t) == .accepted)
        }
        t += 5_000
        guard case .noTokens = r.request(nowMs: t) else { Issue.record("bucket should be empty"); return }
        // One token every 15 minutes from the first use.
        #expect(r.request(nowMs: 1_000_000 + 15 * 60_000) == .accepted)
        guard case .noTokens = r.request(nowMs: 1_000_000 + 15 * 60_000 + 5_000) else { Issue.record("one token only"); return }
        // A long pause refills to 30, never more.
        t = 1_000_000 + 100 * 15 * 60_000
        for i in 0..<30 { #expect(r.request(nowMs: t + Int64(i) * 5_000) == .accepted) }
        guard case .noTokens = r.request(nowMs: t + 30 * 5_000) else { Issue.record("capped at 30"); return }
    }

    @Test func openerReleaseRules() {
        let now: Int64 = 100 * 3_600_000
        let freshSaved = RefreshEvent.success(.saved, lastRefreshMs: now - 3_600_000)
        let staleSaved = RefreshEvent.success(.saved, lastRefreshMs: now - 13 * 3_600_000)
        #expect(OpenerRule.releases(.preferNonDefault, staleSaved, startMs: now))
        #expect(OpenerRule.releases(.preferNonDefault, .success(.network, lastRefreshMs: now), startMs: now))
        #expect(OpenerRule.releases(.preferNonDefault, .failure(.network, reason: "no_network"), startMs: now))
        #expect(!OpenerRule.releases(.preferNonDefault, .failure(.saved, reason: "no_saved_container"), startMs: now))
        #expect(!OpenerRule.releases(.preferNonDefault, .begin(.network), startMs: now))
        #expect(OpenerRule.releases(.preferFresh, freshSaved, startMs: now))
        #expect(!OpenerRule.releases(.preferFresh, staleSaved, startMs: now))
        #expect(OpenerRule.releases(.preferFresh, .success(.network, lastRefreshMs: now), startMs: now))
        #expect(OpenerRule.releases(.preferFresh, .failure(.network, reason: "server_error"), startMs: now))
        #expect(!OpenerRule.releases(.preferFresh, .failure(.saved, reason: "io_error"), startMs: now))
        #expect(OpenerRule.timeout(nil) == 2000)
        #expect(OpenerRule.timeout(0) == 1)
        #expect(OpenerRule.timeout(-5) == 1)
    }

    @Test func previewURLs() {
        #expect(
            PreviewURL.parse("tagmanager.c.com.example.app://preview/p?id=GTM-1234&gtm_auth=abc&gtm_preview=3")
                == .enter(containerId: "GTM-1234", auth: "abc", preview: "3", debug: false))
        #expect(
            PreviewURL.parse("tagmanager.c.app://preview/p?id=GTM-1&gtm_auth=a&gtm_preview=12&gtm_debug=x")
                == .enter(containerId: "GTM-1", auth: "a", preview: "12", debug: true))
        #expect(PreviewURL.parse("tagmanager.c.app://preview/p?id=GTM-1&gtm_preview=") == .exit(containerId: "GTM-1"))
        #expect(PreviewURL.parse("tagmanager.c.app://preview/p?id=GTM-1&gtm_auth=a&gtm_preview=") == .exit(containerId: "GTM-1"))
        #expect(
            PreviewURL.parse("tagmanager.c.app%3A%2F%2Fpreview%2Fp%3Fid%3DGTM-1%26gtm_auth%3Da%26gtm_preview%3D1") != nil,
            "URL-decoded first")
        for bad in [
            "", "https://example.com", "tagmanager.c.://preview/p?id=G&gtm_auth=a&gtm_preview=1",
            "tagmanager.c.app://preview/p?id=G&gtm_auth=a&gtm_preview=x",
            "tagmanager.c.app://preview/p?id=G&gtm_auth=&gtm_preview=1",
            "tagmanager.c.app://preview/p?gtm_auth=a&id=G&gtm_preview=1",
            "tagmanager.c.app://preview/p?id=G&gtm_auth=a&gtm_preview=1&gtm_debug=y",
            "tagmanager.c.app://other/p?id=G&gtm_auth=a&gtm_preview=1",
        ] {
            #expect(PreviewURL.parse(bad) == nil, "\(bad)")
        }
    }
}
