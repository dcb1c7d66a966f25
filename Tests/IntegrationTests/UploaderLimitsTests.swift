import Foundation
import PylonClientKit
import PylonProtocol
import TestSupport
import Testing

/// Issue 21 item 17 (the uploader's part): numeric stream settings have named bounds, and a call
/// or a configuration outside them gets a clear error instead of being accepted or clamped.
@Suite(.serialized) struct UploaderLimitsTests {
    @Test func configureStreamRefusesSettingsOutsideTheirBounds() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: [TestHost.uploader(b, config: ["streams": ["s.*": ["maxBatchBytes": 65536]]])])
        let c = try h.client()
        _ = try c.call("uploader.configureStream", ["stream": "s.cfg", "maxCount": 10])
        let cases: [(JSON, String, Int64, Int64)] = [
            (1e15, "maxBatchBytes", 1024, 8 << 20), (1023, "maxBatchBytes", 1024, 8 << 20), ("big", "maxBatchBytes", 1024, 8 << 20),
            (0, "maxCount", 1, 500), (86_400_001, "intervalMs", 0, 86_400_000),
        ]
        for (value, key, lo, hi) in cases {
            do {
                _ = try c.call("uploader.configureStream", ["stream": "s.cfg", .init(stringLiteral: key): value])
                Issue.record("\(key) \(value.serialized) accepted")
            } catch let e as RPCError {
                #expect(e.code == -32602 && e.message == "\(key) must be an integer from \(lo) to \(hi)", "\(e)")
                #expect(e.data?["param"] == .string(key) && e.data?["min"] == .int(lo) && e.data?["max"] == .int(hi))
            }
        }
        #expect(try c.call("uploader.status")["streams"]?["s.cfg"]?["maxBatchBytes"] == .int(65536), "nothing changed")
        _ = try c.call("uploader.configureStream", ["stream": "s.cfg", "maxBatchBytes": .int(8 << 20)])
        #expect(try c.call("uploader.status")["streams"]?["s.cfg"]?["maxBatchBytes"] == .int(8 << 20))
        _ = try c.call("uploader.configureStream", ["stream": "s.cfg", "maxBatchBytes": .null])
        #expect(try c.call("uploader.status")["streams"]?["s.cfg"]?["maxBatchBytes"] == .int(65536), "null: the configured value")
    }

    /// A configuration outside the bounds stops the plugin (exit 78: `failed`), naming the key.
    @Test func aConfigurationOutsideTheBoundsFailsThePlugin() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: [TestHost.uploader(b, config: ["streams": ["s.*": ["maxBatchBytes": 1e15]]])])
        try h.waitForPlugin("uploader", state: "failed")
    }
}
