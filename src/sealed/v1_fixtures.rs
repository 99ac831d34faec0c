//! Blobs sealed by the build before sealed formats had versions (commit
//! 5609297), one of each kind, under [`sealer`], expiring in 2096: a rolling
//! upgrade must keep opening them. Each kind's tests open its own.

use crate::seal::{SealKey, Sealer};

/// The key they were sealed under.
pub fn sealer() -> Sealer {
    Sealer::new(vec![SealKey { id: "fixture".into(), bytes: [42; 32] }])
}

/// Replay mode: route `/mcp`, principal `anonymous`, `tools/call` `ask`
/// with arguments `{"x": 1}`, owner `gw-1` at `10.0.0.1:9000`, round 2.
pub const FLOW_STATE_REPLAY: &str = "AQdmaXh0dXJlgB3ibf7qzbo7fRZN9T5YzvT3P1elbru938F4PHUDoplNFpDBgjxNu-_EP0pmTGIpXn6DTX2QFrO75Wr9QSYbSSKnHFrI4FgwyezZy-zkmpVU13_b7JNVOxW0TeqnDPWrR5HPvdG2dVxtmMv0yncdBvI4eE3HWFrGJLr3zf1tuiDZdpfqMdJmy_gsVEdrJviip5FTRDgNK5_NpnYFWnh6q-JkzfIuBunggzZSg2C9SJKJC0XMN3_qG3ZHp0lWimlDVmfNDNiwYv8sxmsMmZ8bRAjo5PEkHKA84Az0OjV-uRG_fgvhnZYfhjvgpho0w8lXK18q44sblsuiUXEdozasb3J6vVGfRvuH0ed21qvTXJJsW9T5JVced9d1pHB7WbDS4itqHZeRHeKsAMpXfWjuJaUx7g7qiP4o2pYHp209SSbMBK0twb7FuGDiNkSZJTaJuHV_qmgMsu281kPdp_yi3VWx5XksiT7LpZKtTKllO-mYHjc";

/// Park mode: as [`FLOW_STATE_REPLAY`], round 1, no answers, no owner address.
pub const FLOW_STATE_PARK: &str = "AQdmaXh0dXJlgMxDdX68eteWfGlUOd4vNzSPm7A_KoytlwZmH2oy1rkdyYpfbIznPML6diZ_wFHBLzUzScf8DykFmmwiDcKdMTufG2Bq1anIU15jMbIE01-JxhqaVps4cbNvejV0ctv0LsHvr5j5B8Nuh635hH1vVTa06tO4bUXm7cuq85jzMxCgfU1Vpn38ISKtlFj18iVdG_0tyR1roiH_2sS4YPaxg_ZjsJc4lvZ3rP1q8i01XdV5qYXNC76aD_2Mm8VyXay8MZ9vrc79dFUD46vJOipVuIcdVWmEFubKpFBbg1zY-ATkoj_IHWYoZPdEi7txtRH9Vck0M9S243rSQzq4qnBPxAzqOcdEdTaCEn3YoPwVF5FkXNENnFpkreUXZgZ-u_GbjMfA9Ord";

/// `tools/list` on route `/mcp` for `anonymous`: instance
/// `http://127.0.0.1:1/mcp`, session `sess-1` (2025-11-25), cursor `page-2`.
pub const CURSOR: &str = "AQdmaXh0dXJlBFgICy0nGYp-crbxK3gyficA8NY_vNIDkZmZPiihfcr7INThHcyFmJmqHhM_2vDO-9E5cdzT_pbb2cUWU76r_VuDBbEgSw08Zo-ZlWXB3fxGEuf4HvZH4puVgY4eF8e4CEXquohCeYB-VpGiIvM3r9DKij1O";

/// A relayed session: route `/mcp`, principal `anonymous`, upstream session
/// `up-1` at `http://127.0.0.1:1/mcp`, version 2025-06-18.
pub const LEGACY_SESSION_RELAYED: &str = "AQdmaXh0dXJltxeXlfxzLkSvE3nd8W3XE0WLF_kdCvWlpj8A3wD4-FCSdpFFenJbqDANRylb_Jpv0eZ9JciOcYo3IN5eJQu0BA5gKQhK7lxNOqtrSm6MciD2aLzq8N3kOrFGiktPa92CmFHWt1_q4UDSAToVdH0LVKzhfsYGKZ0z0-cxuw0wmyFZYDUw44sqybaVQIcSxhs1aNF0O3W4DKDKBbzq";

/// A translated session: principal `b:ff`, session id `sid-1`.
pub const LEGACY_SESSION_TRANSLATED: &str = "AQdmaXh0dXJl0KmLFqBf4IMqlS7hWSJwXGZozYAef9ZOWBisxizHFlKJ1KPJu8B9HX_2enAbkmxwS7JdHZ6NsiOqAyFrg1CKnwo3WqPHE20CYDaysC22rPIZ4xd_2Wa4fkrMAmvWvcJCfIrsjI7DZ2i2cWLzPqpmhW1ByBZlFXoK8tRbrKBg0uVf-Ayzj7x3M0y9Euuf6R7CTpxKaQ8JkzSHPt-kqg8wKq0Qh2DwC0351_vItNzj25YNgH8eI8YSWjPuX9n5t4zy7kjyQ_z3XUI";

/// `alice`'s `tools/call` `ask` on `/mcp`, from `http://a/mcp`, the
/// upstream's state `opaque-upstream-state ✓`.
pub const UPSTREAM_STATE: &str = "AQdmaXh0dXJlGa1_I4RfUmWs-ZKHQAvaIH0Y1Etr9XtQa58yCJ1qlEiZEzn7EsS3lpgqzPQSW9SNADMSNa2CUmOFQh8K53DtR14WU80PU7_O8EDSLZIRLkOddRaksru40-qEaK9Win9EGlCaHJdVcRcAd7i_SrXUn9g4vCiPrqVXB6F2Lf5Il5lNUmw0UVmzrA3EXe_NVyYHErrOQDLaH4ryIT5TfUgnh_zF4g";

/// Owner `gw-a` at `10.0.0.1:9000`, round `round`, key `name`, route
/// `/mcp`, principal `alice`, session `session-a`.
pub const QUESTION: &str = "AQdmaXh0dXJlya7tZZh-J9W2YfAOO1OXEEVDZnyCzAMH3QZeuKzVi1J-4wefSh1AUe-5NU2UnmKaeJuAkz3unMMvOtpOMCauAPCxt7r2NS9ojqTV9bc44P4gYnemGVuXUfGBUEOgdRpASpJI7I4ExRJ9CknnG3AMv0WDYGM8E02mKV2sJz1jFH4GTZ1zeOEefnBQwLkp69zRAudhDao9tz1HMaFn";
