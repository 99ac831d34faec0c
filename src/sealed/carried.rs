//! A call's sealed value (its `requestState`), opened once and carried with
//! the call: whoever needs it first (the pipeline asking whether the call
//! resumes a parked one, the internal listener admitting a forwarded retry,
//! the cell resuming it) opens it; everyone after reads what was opened.

use std::any::Any;
use std::sync::OnceLock;

use super::{Claims, Rejected, Sealed};

/// The opened value, of the kind its first opener asked for.
#[derive(Default)]
pub struct Carried {
    opened: OnceLock<Box<dyn Any + Send + Sync>>,
}

impl Carried {
    /// What `open` made of the value, the first time it is asked for; the
    /// same (a refusal included) every time after. Asked for as another
    /// kind than it was opened as, it is [`Rejected::WrongPurpose`].
    pub fn get_or_open<C>(
        &self,
        open: impl FnOnce() -> Result<Sealed<C>, Rejected>,
    ) -> Result<&Sealed<C>, Rejected>
    where
        C: Claims + Send + Sync + 'static,
    {
        let opened = self.opened.get_or_init(|| Box::new(open()));
        match opened.downcast_ref::<Result<Sealed<C>, Rejected>>() {
            Some(Ok(sealed)) => Ok(sealed),
            Some(Err(why)) => Err(*why),
            None => Err(Rejected::WrongPurpose),
        }
    }

    pub fn is_opened(&self) -> bool {
        self.opened.get().is_some()
    }
}

/// A copy of a call starts unopened (it may be changed before it is opened).
impl Clone for Carried {
    fn clone(&self) -> Carried {
        Carried::default()
    }
}

impl std::fmt::Debug for Carried {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_opened() { "Carried(opened)" } else { "Carried(unopened)" })
    }
}
