"""Lightning systems and the runs that drive them: pre-training, its checks and builders, its run folders, and
the parts fine-tuning (finetuning/) shares: the precision a run attempts (`build`) and the progress heartbeat."""

import logging

LITLOGGER_TIP = "💡 Tip: For seamless cloud logging"


def _not_litlogger_tip(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(LITLOGGER_TIP)


# Lightning 2.6 logs an advert for its cloud logger (litlogger) from every Trainer made without one, and has no
# switch for it; runs here log to MLflow. Only that message is dropped, from the loggers Lightning's
# rank_zero_info writes to; its other messages stay.
for _name in ("pytorch_lightning.utilities.rank_zero", "lightning_fabric.utilities.rank_zero"):
    if _not_litlogger_tip not in logging.getLogger(_name).filters:
        logging.getLogger(_name).addFilter(_not_litlogger_tip)
