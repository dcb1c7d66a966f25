import Foundation
import PylonClientKit
import TestSupport
import Testing

/// MA parameter rules the method reference (docs/MA.md) found loose.
@Suite(.serialized) struct MAStrictParamTests {
    @Test func startRefusesANonBooleanCollectionSwitch() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        let c = try h.client()
        for bad: JSON in ["false", 0, ["x": 1]] {
            #expect(code(try c.call("ma.start", ["appKey": "strict", "dataCollectionEnabled": bad])) == -3, "\(bad)")
        }
        #expect(code(try c.call("ma.start", ["appKey": "strict", "dataCollectionEnabled": false])) == 0)
        #expect(try c.call("ma.isDataCollectionEnabled")["enabled"] == .bool(false))
    }

    @Test func setCollectControlIsAllOrNothing() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        let c = try h.client()
        _ = try c.call("ma.start", ["appKey": "cc"])
        #expect(code(try c.call("ma.setCollectControl", ["idfa": true, "idfv": true, "carrier": "no"])) == -3)
        _ = try c.call("ma.eventRecord", ["eventName": "probe"])
        let ev = try #require(try b.maEvents("cc", flushedBy: c).first { $0["data"]?["event"] == .string("probe") })
        #expect(ev["data"]?["device"]?["idfv"] == nil, "nothing of a refused call applied")
    }
}
