"""Training algorithms other than joint training (config group `algorithm`; joint is `system.PretrainSystem`).

Paper section 3.2 and Appendix F: two-stage training (`two_stage.TwoStage`) and adversarial training with
REINFORCE (`adversarial.Adversarial`). Both step their own optimizers with Lightning's manual optimisation
(`manual.ManualSystem`); everything else (metric windows, exact resume, exports) is the joint system's.
"""
